"""The shared_weight transform on the four layouts the families need: T5, GPT-2, BERT/RoBERTa, BART.

Each case is an excerpt in the shape of the 4.5.1 source (the calls that lead from a model down to
the embedding and the tied head), with the options its recipe gives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from common.schema import OptionError
from transforms.library.base import TransformError
from transforms.shared_weight import SharedWeight, SharedWeightOptions

COMMON: dict[str, Any] = {"weight": "shared_embed_weight", "parameter": "shared_embedding"}

# make_stateless/make_stateful/stateful_state_dict, as added to a model owning the weight.
METHODS = '''
    def make_stateless(self):
        """Make the shared embedding one top-level parameter, shared_embed_weight, used by stateless layers.

        For pipeline partitioners; a no-op if already stateless. stateful_state_dict() and
        make_stateful() give the stock layout (HF state-dict keys) back.
        """
        return stateless.make_stateless(
            self,
            shared="{shared}",
            weight="shared_embed_weight",
            users={users},
            tied_linear={tied},
        )

    def make_stateful(self):
        """Undo make_stateless(): the stock module layout, sharing the same parameter."""
        return stateless.make_stateful(self)

    def stateful_state_dict(self):
        """The state dict with stock HF keys, in either form."""
        return stateless.stateful_state_dict(self)
'''


def methods(shared: str, users: str, tied: str = "None") -> str:
    return METHODS.format(shared=shared, users=users, tied=tied)


# -- T5: a model-level module registered again in two stacks; the stacks receive the weight ---------------

T5: dict[str, Any] = dict(COMMON, models={
    "T5Model": {"shared": "shared", "users": ["encoder.embed_tokens", "decoder.embed_tokens"]},
    "T5ForConditionalGeneration": {"shared": "shared", "users": ["encoder.embed_tokens", "decoder.embed_tokens"],
                                   "tied_linear": "lm_head", "tied_when": "self.config.tie_word_embeddings"},
}, forwards={
    "T5Stack": {"uses": ["self.embed_tokens"]},
    "T5Model": {"calls": {"self.encoder": "T5Stack", "self.decoder": "T5Stack"}},
    "T5ForConditionalGeneration": {"calls": {"self.encoder": "T5Stack", "self.decoder": "T5Stack"},
                                   "uses": ["self.lm_head"]},
})

T5_BEFORE = '''\
class T5Stack(T5PreTrainedModel):
    def forward(self, input_ids=None, attention_mask=None):
        inputs_embeds = self.embed_tokens(input_ids)
        return self.block(inputs_embeds, attention_mask)


class T5Model(T5PreTrainedModel):
    def forward(self, input_ids=None, decoder_input_ids=None):
        encoder_outputs = self.encoder(input_ids=input_ids)
        return self.decoder(input_ids=decoder_input_ids, encoder_hidden_states=encoder_outputs[0])


class T5ForConditionalGeneration(T5PreTrainedModel):
    def forward(self, input_ids=None, decoder_input_ids=None):
        hidden_states = self.encoder(input_ids=input_ids)[0]
        sequence_output = self.decoder(input_ids=decoder_input_ids, encoder_hidden_states=hidden_states)[0]
        return self.lm_head(sequence_output)
'''

T5_AFTER = '''\
import stateless

class T5Stack(T5PreTrainedModel):
    def forward(self, shared_embedding, input_ids=None, attention_mask=None):
        inputs_embeds = stateless.call_shared(self.embed_tokens, shared_embedding, input_ids)
        return self.block(inputs_embeds, attention_mask)


class T5Model(T5PreTrainedModel):
    def forward(self, input_ids=None, decoder_input_ids=None):
        encoder_outputs = self.encoder(stateless.shared_weight(self, "shared", "shared_embed_weight"), input_ids=input_ids)
        return self.decoder(stateless.shared_weight(self, "shared", "shared_embed_weight"), input_ids=decoder_input_ids, encoder_hidden_states=encoder_outputs[0])
''' + methods("shared", '("encoder.embed_tokens", "decoder.embed_tokens")') + '''

class T5ForConditionalGeneration(T5PreTrainedModel):
    def forward(self, input_ids=None, decoder_input_ids=None):
        hidden_states = self.encoder(stateless.shared_weight(self, "shared", "shared_embed_weight"), input_ids=input_ids)[0]
        sequence_output = self.decoder(stateless.shared_weight(self, "shared", "shared_embed_weight"), input_ids=decoder_input_ids, encoder_hidden_states=hidden_states)[0]
        return stateless.call_shared(self.lm_head, stateless.shared_weight(self, "shared", "shared_embed_weight"), sequence_output)
''' + methods("shared", '("encoder.embed_tokens", "decoder.embed_tokens")',
              '"lm_head" if self.config.tie_word_embeddings else None')


def test_t5_stacks_receive_the_weight_first() -> None:
    assert_rewrites(SharedWeight, T5_BEFORE, T5_AFTER, **T5)


# -- GPT-2: the base model owns wte and is a model on its own; the LM head model passes it by keyword --------

GPT2: dict[str, Any] = dict(COMMON, models={
    "GPT2Model": {"shared": "wte", "users": ["wte"]},
    "GPT2LMHeadModel": {"shared": "transformer.wte", "users": ["transformer.wte"], "tied_linear": "lm_head",
                        "tied_when": "self.config.tie_word_embeddings"},
}, forwards={
    "GPT2Model": {"uses": ["self.wte"]},
    "GPT2LMHeadModel": {"calls": {"self.transformer": "GPT2Model"}, "uses": ["self.lm_head"]},
})

GPT2_BEFORE = '''\
class GPT2Model(GPT2PreTrainedModel):
    def forward(
        self,
        input_ids=None,
        token_type_ids=None,
    ):
        hidden_states = self.wte(input_ids) + self.wpe(position_ids)
        if token_type_ids is not None:
            hidden_states = hidden_states + self.wte(token_type_ids)
        return hidden_states


class GPT2LMHeadModel(GPT2PreTrainedModel):
    def forward(
        self,
        input_ids=None,
        token_type_ids=None,
    ):
        transformer_outputs = self.transformer(
            input_ids,
            token_type_ids=token_type_ids,
        )
        return self.lm_head(transformer_outputs)
'''

GPT2_AFTER = '''\
import stateless

class GPT2Model(GPT2PreTrainedModel):
    def forward(
        self,
        input_ids=None,
        token_type_ids=None,
        shared_embedding=None,
    ):
        hidden_states = stateless.call_shared(self.wte, stateless.shared_weight(self, "wte", "shared_embed_weight", shared_embedding), input_ids) + self.wpe(position_ids)
        if token_type_ids is not None:
            hidden_states = hidden_states + stateless.call_shared(self.wte, stateless.shared_weight(self, "wte", "shared_embed_weight", shared_embedding), token_type_ids)
        return hidden_states
''' + methods("wte", '("wte",)') + '''

class GPT2LMHeadModel(GPT2PreTrainedModel):
    def forward(
        self,
        input_ids=None,
        token_type_ids=None,
    ):
        transformer_outputs = self.transformer(
            input_ids,
            token_type_ids=token_type_ids,
            shared_embedding=stateless.shared_weight(self, "transformer.wte", "shared_embed_weight"),
        )
        return stateless.call_shared(self.lm_head, stateless.shared_weight(self, "transformer.wte", "shared_embed_weight"), transformer_outputs)
''' + methods("transformer.wte", '("transformer.wte",)', '"lm_head" if self.config.tie_word_embeddings else None')


def test_gpt2_base_model_takes_the_weight_as_an_optional_keyword() -> None:
    assert_rewrites(SharedWeight, GPT2_BEFORE, GPT2_AFTER, **GPT2)


def test_an_optional_parameter_goes_before_keyword_only_ones() -> None:
    options = dict(COMMON, models={"Base": {"shared": "wte", "users": ["wte"]},
                                   "Head": {"shared": "base.wte", "users": ["base.wte"]}},
                   forwards={"Base": {"uses": ["self.wte"]}, "Head": {"calls": {"self.base": "Base"}}})
    before = '''\
class Base:
    def forward(self, ids, *, scale=1, **kwargs):
        return self.wte(ids) * scale


class Head:
    def forward(self, ids, **kwargs):
        return self.base(ids, **kwargs)
'''
    result = run(SharedWeight, before, **options)
    assert "def forward(self, ids, *, scale=1, shared_embedding=None, **kwargs):" in result
    assert 'return self.base(ids, **kwargs, shared_embedding=stateless.shared_weight(self, "base.wte", ' \
           '"shared_embed_weight"))' in result
    assert run(SharedWeight, result, **options) == result


# -- BERT/RoBERTa: two levels down to the word embeddings; the tied decoder two levels down the head ----------

BERT: dict[str, Any] = dict(COMMON, models={
    "BertModel": {"shared": "embeddings.word_embeddings", "users": ["embeddings.word_embeddings"]},
    "BertForMaskedLM": {"shared": "bert.embeddings.word_embeddings", "users": ["bert.embeddings.word_embeddings"],
                        "tied_linear": "cls.predictions.decoder", "tied_when": "self.config.tie_word_embeddings"},
}, forwards={
    "BertEmbeddings": {"uses": ["self.word_embeddings"]},
    "BertModel": {"calls": {"self.embeddings": "BertEmbeddings"}},
    "BertLMPredictionHead": {"uses": ["self.decoder"]},
    "BertOnlyMLMHead": {"calls": {"self.predictions": "BertLMPredictionHead"}},
    "BertForMaskedLM": {"calls": {"self.bert": "BertModel", "self.cls": "BertOnlyMLMHead"}},
})

BERT_BEFORE = '''\
class BertEmbeddings(nn.Module):
    def forward(self, input_ids=None, token_type_ids=None, inputs_embeds=None):
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        return self.LayerNorm(inputs_embeds + self.token_type_embeddings(token_type_ids))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, hidden_states):
        hidden_states = self.transform(hidden_states)
        hidden_states = self.decoder(hidden_states)
        return hidden_states


class BertOnlyMLMHead(nn.Module):
    def forward(self, sequence_output):
        prediction_scores = self.predictions(sequence_output)
        return prediction_scores


class BertModel(BertPreTrainedModel):
    def forward(self, input_ids=None, token_type_ids=None):
        embedding_output = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        return self.encoder(embedding_output)


class BertForMaskedLM(BertPreTrainedModel):
    def forward(self, input_ids=None, labels=None):
        outputs = self.bert(input_ids)
        prediction_scores = self.cls(outputs[0])
        return prediction_scores
'''

BERT_AFTER = '''\
import stateless

class BertEmbeddings(nn.Module):
    def forward(self, shared_embedding, input_ids=None, token_type_ids=None, inputs_embeds=None):
        if inputs_embeds is None:
            inputs_embeds = stateless.call_shared(self.word_embeddings, shared_embedding, input_ids)
        return self.LayerNorm(inputs_embeds + self.token_type_embeddings(token_type_ids))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, shared_embedding, hidden_states):
        hidden_states = self.transform(hidden_states)
        hidden_states = stateless.call_shared(self.decoder, shared_embedding, hidden_states)
        return hidden_states


class BertOnlyMLMHead(nn.Module):
    def forward(self, shared_embedding, sequence_output):
        prediction_scores = self.predictions(shared_embedding, sequence_output)
        return prediction_scores


class BertModel(BertPreTrainedModel):
    def forward(self, input_ids=None, token_type_ids=None, shared_embedding=None):
        embedding_output = self.embeddings(stateless.shared_weight(self, "embeddings.word_embeddings", "shared_embed_weight", shared_embedding), input_ids=input_ids, token_type_ids=token_type_ids)
        return self.encoder(embedding_output)
''' + methods("embeddings.word_embeddings", '("embeddings.word_embeddings",)') + '''

class BertForMaskedLM(BertPreTrainedModel):
    def forward(self, input_ids=None, labels=None):
        outputs = self.bert(input_ids, shared_embedding=stateless.shared_weight(self, "bert.embeddings.word_embeddings", "shared_embed_weight"))
        prediction_scores = self.cls(stateless.shared_weight(self, "bert.embeddings.word_embeddings", "shared_embed_weight"), outputs[0])
        return prediction_scores
''' + methods("bert.embeddings.word_embeddings", '("bert.embeddings.word_embeddings",)',
              '"cls.predictions.decoder" if self.config.tie_word_embeddings else None')


def test_bert_weight_threads_two_levels_down_to_the_embeddings_and_the_decoder() -> None:
    assert_rewrites(SharedWeight, BERT_BEFORE, BERT_AFTER, **BERT)


# -- BART: T5's layout one level deeper, the base model a model on its own -------------------------------------

BART: dict[str, Any] = dict(COMMON, models={
    "BartModel": {"shared": "shared", "users": ["encoder.embed_tokens", "decoder.embed_tokens"]},
    "BartForConditionalGeneration": {"shared": "model.shared",
                                     "users": ["model.encoder.embed_tokens", "model.decoder.embed_tokens"],
                                     "tied_linear": "lm_head", "tied_when": "self.config.tie_word_embeddings"},
}, forwards={
    "BartEncoder": {"uses": ["self.embed_tokens"]},
    "BartDecoder": {"uses": ["self.embed_tokens"]},
    "BartModel": {"calls": {"self.encoder": "BartEncoder", "self.decoder": "BartDecoder"}},
    "BartForConditionalGeneration": {"calls": {"self.model": "BartModel"}, "uses": ["self.lm_head"]},
})

BART_BEFORE = '''\
class BartEncoder(BartPretrainedModel):
    def forward(self, input_ids=None, attention_mask=None):
        inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale
        return self.layers(inputs_embeds, attention_mask)


class BartDecoder(BartPretrainedModel):
    def forward(self, input_ids=None, encoder_hidden_states=None):
        inputs_embeds = self.embed_tokens(input_ids) * self.embed_scale
        return self.layers(inputs_embeds, encoder_hidden_states)


class BartModel(BartPretrainedModel):
    def forward(self, input_ids=None, decoder_input_ids=None):
        encoder_outputs = self.encoder(input_ids=input_ids)
        return self.decoder(input_ids=decoder_input_ids, encoder_hidden_states=encoder_outputs[0])


class BartForConditionalGeneration(BartPretrainedModel):
    def forward(self, input_ids=None, decoder_input_ids=None):
        outputs = self.model(input_ids, decoder_input_ids=decoder_input_ids)
        return self.lm_head(outputs[0]) + self.final_logits_bias
'''

BART_AFTER = '''\
import stateless

class BartEncoder(BartPretrainedModel):
    def forward(self, shared_embedding, input_ids=None, attention_mask=None):
        inputs_embeds = stateless.call_shared(self.embed_tokens, shared_embedding, input_ids) * self.embed_scale
        return self.layers(inputs_embeds, attention_mask)


class BartDecoder(BartPretrainedModel):
    def forward(self, shared_embedding, input_ids=None, encoder_hidden_states=None):
        inputs_embeds = stateless.call_shared(self.embed_tokens, shared_embedding, input_ids) * self.embed_scale
        return self.layers(inputs_embeds, encoder_hidden_states)


class BartModel(BartPretrainedModel):
    def forward(self, input_ids=None, decoder_input_ids=None, shared_embedding=None):
        encoder_outputs = self.encoder(stateless.shared_weight(self, "shared", "shared_embed_weight", shared_embedding), input_ids=input_ids)
        return self.decoder(stateless.shared_weight(self, "shared", "shared_embed_weight", shared_embedding), input_ids=decoder_input_ids, encoder_hidden_states=encoder_outputs[0])
''' + methods("shared", '("encoder.embed_tokens", "decoder.embed_tokens")') + '''

class BartForConditionalGeneration(BartPretrainedModel):
    def forward(self, input_ids=None, decoder_input_ids=None):
        outputs = self.model(input_ids, decoder_input_ids=decoder_input_ids, shared_embedding=stateless.shared_weight(self, "model.shared", "shared_embed_weight"))
        return stateless.call_shared(self.lm_head, stateless.shared_weight(self, "model.shared", "shared_embed_weight"), outputs[0]) + self.final_logits_bias
''' + methods("model.shared", '("model.encoder.embed_tokens", "model.decoder.embed_tokens")',
              '"lm_head" if self.config.tie_word_embeddings else None')


def test_bart_base_model_threads_to_both_stacks_and_takes_the_weight_from_its_caller() -> None:
    assert_rewrites(SharedWeight, BART_BEFORE, BART_AFTER, **BART)


# -- no-ops and mismatches ----------------------------------------------------------------------------------

@pytest.mark.parametrize("before,options", [(T5_BEFORE, T5), (GPT2_BEFORE, GPT2), (BERT_BEFORE, BERT),
                                            (BART_BEFORE, BART)], ids=["t5", "gpt2", "bert", "bart"])
def test_the_output_is_a_fixed_point(before: str, options: dict) -> None:
    once = run(SharedWeight, before, **options)
    assert run(SharedWeight, once, **options) == once


def test_classes_outside_the_recipe_and_other_methods_are_left_alone() -> None:
    code = '''\
import stateless


class T5Stack(T5PreTrainedModel):
    def forward(self, shared_embedding, input_ids=None):
        return stateless.call_shared(self.embed_tokens, shared_embedding, input_ids)

    def get_input_embeddings(self):
        return self.embed_tokens(None)


class Other(nn.Module):
    def forward(self, input_ids):
        return self.encoder(self.embed_tokens(input_ids))
'''
    options = dict(COMMON, models={"T5Model": {"shared": "shared", "users": ["encoder.embed_tokens"]}},
                   forwards={"T5Stack": {"uses": ["self.embed_tokens"]},
                             "T5Model": {"calls": {"self.encoder": "T5Stack"}}})
    model = '''

class T5Model(T5PreTrainedModel):
    def forward(self, input_ids=None):
        return self.encoder(stateless.shared_weight(self, "shared", "shared_embed_weight"), input_ids=input_ids)
''' + methods("shared", '("encoder.embed_tokens",)')
    assert_unchanged(SharedWeight, code + model, **options)


@pytest.mark.parametrize("source,message", [
    ("class T5Stack:\n    def forward(self, x):\n        return x\n\n\nclass T5Model:\n"
     "    def forward(self, x):\n        return self.encoder(x)\n",
     r"T5Stack.forward has no call of self.embed_tokens"),
    ("class T5Stack:\n    def forward(self, x):\n        return self.embed_tokens(x)\n\n\nclass T5Model:\n"
     "    def forward(self, x):\n        return self.decoder(x)\n",
     r"T5Model.forward has no call of self.encoder"),
    ("class T5Stack:\n    def call(self, x):\n        return self.embed_tokens(x)\n\n\nclass T5Model:\n"
     "    def forward(self, x):\n        return self.encoder(x)\n",
     r"T5Stack has no forward method"),
])
def test_a_source_that_does_not_fit_the_recipe_is_an_error(source: str, message: str) -> None:
    options = dict(COMMON, models={"T5Model": {"shared": "shared", "users": ["encoder.embed_tokens"]}},
                   forwards={"T5Stack": {"uses": ["self.embed_tokens"]},
                             "T5Model": {"calls": {"self.encoder": "T5Stack"}}})
    with pytest.raises(TransformError, match=message):
        run(SharedWeight, source, **options)


def test_a_class_the_module_lacks_is_a_warning() -> None:
    import libcst as cst
    from libcst.codemod import CodemodContext

    context = CodemodContext()
    options = dict(COMMON, models={"T5Model": {"shared": "shared", "users": ["encoder.embed_tokens"]}},
                   forwards={"T5Stack": {"uses": ["self.embed_tokens"]},
                             "T5Model": {"calls": {"self.encoder": "T5Stack"}}})
    source = "class T5Stack:\n    def forward(self, x):\n        return self.embed_tokens(x)\n"
    result = SharedWeight(context, **options).transform_module(cst.parse_module(source)).code
    assert "def forward(self, shared_embedding, x)" in result
    assert context.warnings == ["shared_weight: no class T5Model in the module"]


@pytest.mark.parametrize("change,message", [
    (lambda o: o["forwards"]["GPT2LMHeadModel"]["calls"].update({"self.transformer": "GPT2Modl"}),
     "forwards.GPT2LMHeadModel.calls: self.transformer runs GPT2Modl, which has no forwards entry"),
    (lambda o: o["forwards"].pop("GPT2LMHeadModel"), "forwards.GPT2LMHeadModel: missing"),
    (lambda o: o["forwards"].update(Orphan={"uses": ["self.wte"]}), "forwards.Orphan: neither a model nor called"),
    (lambda o: o["models"]["GPT2Model"].update(users=[]), "models.GPT2Model.users: name at least one"),
    (lambda o: o["models"]["GPT2LMHeadModel"].pop("tied_when"), "tied_linear and tied_when go together"),
    (lambda o: o["models"]["GPT2Model"].update(shraed="wte"), "models.GPT2Model.shraed: unknown key"),
])
def test_options_are_checked(change: Callable[[dict[str, Any]], object], message: str) -> None:
    import copy

    from common.schema import parse_options
    options = copy.deepcopy(GPT2)
    change(options)
    with pytest.raises(OptionError, match=message):
        parse_options(SharedWeightOptions, options)


def test_the_layouts_in_docs_families_md_are_the_ones_tested_here() -> None:
    import re

    import tomllib
    from conftest import REPO
    text = (REPO / "docs" / "families.md").read_text()
    block = re.search(r"^### The `shared_weight` step\n.*?```toml\n(.*?)^```", text, re.S | re.M)
    assert block is not None
    shown = tomllib.loads(block.group(1))["transforms"]
    for layout in (T5, GPT2, BERT, BART):
        for table in ("models", "forwards"):
            for name, options in layout[table].items():
                if name != "T5Model":  # the docs show T5's head model only
                    assert shown[table][name] == options, (table, name)
