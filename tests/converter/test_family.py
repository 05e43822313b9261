"""The family definition: loading and validating recipe data, and the generic machinery that reads it.

Covers families/definition.py (schema, one-line errors naming file and key, shared weights read off the
shared_weight step), families/models.py and families/family.py (chains from module patterns,
inputs from specs, micro-batches, configs of named shapes), the IPU roles derived from the recipe, and
the drafts in docs/families.md against the stock transformers 4.5.1 module trees.
"""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from pathlib import Path

import pytest
import tomllib
import torch
from support.t5_models import T5, config

from common.errors import UserError
from families.definition import FamilyDefinition, InputSpec, parse_definition
from families.family import ModelFamily
from families.models import MicroBatch, accepted, make_inputs
from partitioning.cost.blocks import chain_specs
from partitioning.cost.chain import family_chain
from partitioning.gpu.train import rebuild
from partitioning.ipu.errors import IPUError
from partitioning.ipu.roles import Roles, derive_roles, roles_for

REPO = Path(__file__).resolve().parents[2]
T5_TEXT = (resources.files("families") / "recipe_data" / "t5.toml").read_text(encoding="utf-8")


def t5_data(text: str = T5_TEXT) -> dict:
    return tomllib.loads(text)


# --- loading -------------------------------------------------------------------------------------------------


def test_t5_definition_loads_with_its_shared_weights_read_off_the_shared_weight_step() -> None:
    data = t5_data()
    definition = parse_definition(data, "t5.toml")
    assert definition is not None
    assert list(definition.classes) == data["classes"]
    assert [name for name, info in definition.classes.items() if info.trains] == ["T5ForConditionalGeneration"]
    assert definition.config_path == "transformers.T5Config"
    assert definition.lengths == {"source": 512, "target": 128}
    assert [spec.name for spec in definition.inputs] == ["input_ids", "attention_mask", "decoder_input_ids",
                                                        "decoder_attention_mask", "labels"]
    assert definition.layer_lists("T5Model") == ("encoder.block", "decoder.block")
    assert definition.shapes["t5-3b"]["d_ff"] == 16384 and definition.shapes["t5-3b"]["vocab_size"] == 32128
    step = next(step for step in data["transforms"] if step["name"] == "shared_weight")
    for class_name, options in step["models"].items():
        (weight,) = definition.shared[class_name]
        assert (weight.weight, weight.module) == (step["weight"], options["shared"])
        assert list(weight.users) == options["users"]
        assert weight.tied_linear == options.get("tied_linear")
    (head,) = definition.shared["T5ForConditionalGeneration"]
    assert head.tied_config == "tie_word_embeddings"
    assert head.tied({"tie_word_embeddings": False}) is False and head.tied({}) is True


@pytest.mark.parametrize("old,new,message", [
    ('modules = ["encoder.embed_tokens", "encoder.dropout"]', 'modulez = ["encoder.embed_tokens"]',
     "unknown key 'pipeline.blocks[0].modulez' (known there: layers, modules, name, optional, root, sublayers)"),
    ('[model.classes.T5Model]\noutput', '[model.classes.T5Model]\noutptu',
     "unknown key 'model.classes.T5Model.outptu'"),
    ('default_class = ', 'default_clas = ', "unknown key 'model.default_clas'"),
    ("[pipeline.lengths]", "[pipeline.length]", "unknown key 'pipeline.length'"),
    ('attention_mask = { shape = ["batch", "source"], fill = "ones" }',
     'attention_mask = { shape = ["batch", "source"], fil = "ones" }',
     "unknown key 'pipeline.inputs.attention_mask.fil'"),
    ("[shapes.named]", "[shapes.nmed]", "unknown key 'shapes.nmed'"),
    ("[model.classes.T5EncoderModel]", "[model.classes.T5EncoderModl]", "unknown key 'model.classes.T5EncoderModl'"),
    ("source = 512", 'source = "512"', "pipeline.lengths.source must be a positive integer, got '512'"),
    ('labels = { shape = ["batch", "target"]', 'labels = { shape = ["batch", "tgt"]',
     "pipeline.inputs.labels.shape[1] 'tgt' is neither 'batch' nor a length"),
    ('fill = "ones" }', 'fill = "ones", low = 1 }', 'pipeline.inputs.attention_mask.low is only for fill = "randint"'),
    ('low = 1, high = "vocab_size" }\nattention_mask', 'low = 1 }\nattention_mask',
     "pipeline.inputs.input_ids.high is missing"),
    ('fill = "ones" }', 'fill = "one" }', "pipeline.inputs.attention_mask.fill must be one of randint, ones, zeros"),
    ('default = "t5-small"', 'default = "t5-tiny"', "shapes.default 't5-tiny' is not one of shapes.named"),
    ('name = "lm_head"\nmodules', 'name = "lm_head"\nroot = "yes"\nmodules',
     "pipeline.blocks[6].root must be true or false"),
    ('layers = "encoder.block"', 'layers = "encoder.block"\nname = "x"', "pipeline.blocks[1].name: a layer list"),
    ('name = "encoder.final"', 'name = "encoder.embed"', "'encoder.embed' appears twice in the chain"),
    ('modules = ["encoder.final_layer_norm"]', 'modules = []', "pipeline.blocks[2].modules must be a non-empty list"),
    ('modules = ["encoder.final_layer_norm"]', 'modules = ["encoder..final"]', "must be a module path"),
    ("[model.classes.T5EncoderModel]\noutput = \"last_hidden_state\"\n", "",
     "model.classes.T5EncoderModel is missing"),
    ("[model.classes.T5EncoderModel]\n", "[model.classes.T5EncoderModel]\nomit = [\"decoder_ids\"]\n",
     "model.classes.T5EncoderModel.omit names 'decoder_ids', not one of [pipeline.inputs]"),
    ('default_class = "T5ForConditionalGeneration"', 'default_class = "T5ForEverything"',
     "model.default_class 'T5ForEverything' is not one of the recipe's classes"),
    ("source = 512", "seq = 512", "pipeline.lengths: 'seq' is reserved"),
    ('tied_when = "self.config.tie_word_embeddings"', 'tied_when = "config.tie or True"',
     "tied_when must read one config flag (self.config.NAME)"),
    ("t5-small = { d_model = 512,", "t5-small = { d_model = { x = 1 },",
     "shapes.named.t5-small.d_model must be a config value"),
])
def test_a_bad_key_is_one_line_naming_the_file_and_the_key(old: str, new: str, message: str) -> None:
    assert old in T5_TEXT, old
    with pytest.raises(UserError) as raised:
        parse_definition(t5_data(T5_TEXT.replace(old, new, 1)), "t5.toml")
    text = raised.value.one_line()
    assert text.startswith("recipe t5.toml: ") and message in text and "\n" not in text


def test_a_recipe_without_family_sections_has_no_definition_and_a_partial_one_is_an_error() -> None:
    data = {key: value for key, value in t5_data().items() if key not in ("model", "pipeline", "shapes", "ipu")}
    assert parse_definition(data, "t5.toml") is None
    with pytest.raises(UserError, match=r"recipe t5.toml: the family definition needs .*\[pipeline\] is missing"):
        parse_definition({**data, "model": t5_data()["model"]}, "t5.toml")
    with pytest.raises(UserError, match=r"recipe t5.toml: \[ipu\] belongs to a family definition"):
        parse_definition({**data, "ipu": t5_data()["ipu"]}, "t5.toml")


def test_partition_model_reports_a_misspelled_family_key_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from families import registry
    from partitioning.cli import main

    broken = T5_TEXT.replace('[model.classes.T5Model]\noutput', '[model.classes.T5Model]\noutputs', 1)
    monkeypatch.setattr(registry, "recipe_documents", lambda: [("t5.toml", broken)])
    assert main(["t5", "--version", "4.5.1", "--stages", "2", "--output", str(tmp_path / "plan.json")]) == 2
    err = capsys.readouterr().err
    assert err == ("partition-model: error: recipe t5.toml: unknown key 'model.classes.T5Model.outputs' "
                   "(known there: base, causal_lm, inputs, omit, output)\n")


def test_input_specs_round_trip_through_a_plan_and_are_checked_there() -> None:
    for spec in T5.definition.inputs:
        assert InputSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    with pytest.raises(UserError, match="^plan: inputs.x.fill must be one of"):
        InputSpec.from_dict({"name": "x", "shape": ["batch"], "fill": "random"})


# --- chains from module patterns -------------------------------------------------------------------------------

TOY = """
family = "toy"
package = "transformers"
classes = ["ToyModel", "ToyForLoss"]

[model]
config = "PretrainedConfig"
default_class = "ToyForLoss"
[model.classes.ToyModel]
output = "hidden"
[model.classes.ToyForLoss]
output = "loss"
base = "backbone"

[pipeline.lengths]
tokens = 6

[pipeline.inputs]
ids = { shape = ["batch", "tokens"], fill = "randint", low = 1, high = "vocab_size" }
mask = { shape = ["batch", "tokens"], fill = "ones", dtype = "float32" }
labels = { shape = ["batch", "tokens"], fill = "randint", high = "vocab_size" }
flag = { shape = ["batch"], fill = "zeros" }

[[pipeline.blocks]]
name = "embed"
modules = ["embed", "drop"]
[[pipeline.blocks]]
layers = "layers"
sublayers = [["norm", "mix"], ["cross"], ["out"]]
[[pipeline.blocks]]
name = "pool"
modules = ["pool"]
[[pipeline.blocks]]
name = "head"
modules = ["head"]
root = true

[shapes]
default = "toy-small"
[shapes.named]
toy-small = { vocab_size = 11 }
"""


class _Layer(torch.nn.Module):
    def __init__(self, cross: bool) -> None:
        super().__init__()
        self.norm, self.mix, self.out = torch.nn.LayerNorm(4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.cross = torch.nn.Linear(4, 4) if cross else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mix(self.norm(x))
        if self.cross is not None:
            x = x + self.cross(x)
        return x + self.out(x)


class _Backbone(torch.nn.Module):
    def __init__(self, layers: int, pool: bool, cross: bool = False) -> None:
        super().__init__()
        self.embed, self.drop = torch.nn.Embedding(11, 4), torch.nn.Dropout(0.0)
        self.layers = torch.nn.ModuleList(_Layer(cross) for _ in range(layers))
        self.pool = torch.nn.Linear(4, 4) if pool else None

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.embed(ids)) * mask[..., None]
        for layer in self.layers:
            x = layer(x)
        return self.pool(x) if self.pool is not None else x


class _ForLoss(torch.nn.Module):
    def __init__(self, layers: int = 3, cross: bool = False) -> None:
        super().__init__()
        self.backbone, self.head = _Backbone(layers, pool=False, cross=cross), torch.nn.Linear(4, 11)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.backbone(ids, mask))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def toy() -> FamilyDefinition:
    definition = parse_definition(tomllib.loads(TOY), "toy.toml")
    assert definition is not None
    return definition


def test_a_block_applies_to_a_class_when_its_first_module_exists() -> None:
    definition = toy()
    with_head = chain_specs(definition.entries("ToyForLoss"), _ForLoss())
    assert [(s.name, s.modules) for s in with_head] == [
        ("embed", ("backbone.embed", "backbone.drop")), ("backbone.layers.0", ("backbone.layers.0",)),
        ("backbone.layers.1", ("backbone.layers.1",)), ("backbone.layers.2", ("backbone.layers.2",)),
        ("head", ("head",))]  # base prefixed, the root head not; the pool is None in this class: no block
    base = chain_specs(definition.entries("ToyModel"), _Backbone(2, pool=True))
    assert [s.name for s in base] == ["embed", "layers.0", "layers.1", "pool"]  # no head in the base model
    assert definition.layer_lists("ToyForLoss") == ("backbone.layers",)
    assert definition.block_starts("ToyForLoss") == ("backbone.embed", "backbone.layers.0", "backbone.pool", "head")


def test_layers_group_by_granularity_and_split_into_sub_layers() -> None:
    entries = toy().entries("ToyForLoss")
    grouped = chain_specs(entries, _ForLoss(layers=5), layers_per_block=2)
    assert [(s.name, s.modules) for s in grouped][1:4] == [
        ("backbone.layers.0-1", ("backbone.layers.0", "backbone.layers.1")),
        ("backbone.layers.2-3", ("backbone.layers.2", "backbone.layers.3")),
        ("backbone.layers.4", ("backbone.layers.4",))]
    split = chain_specs(entries, _ForLoss(layers=2, cross=True), sublayers=True)
    assert [(s.name, s.modules) for s in split][1:4] == [
        ("backbone.layers.0.norm", ("backbone.layers.0.norm", "backbone.layers.0.mix")),
        ("backbone.layers.0.cross", ("backbone.layers.0.cross",)),
        ("backbone.layers.0.out", ("backbone.layers.0.out",))]
    without_cross = chain_specs(entries, _ForLoss(layers=1), sublayers=True)  # a sub-layer applies when it exists
    assert [s.name for s in without_cross] == ["embed", "backbone.layers.0.norm", "backbone.layers.0.out", "head"]
    with pytest.raises(UserError, match="at least 1 layer per block"):
        chain_specs(entries, _ForLoss(), layers_per_block=0)


def test_a_block_whose_first_module_exists_needs_every_other_module() -> None:
    model = _ForLoss()
    del model.backbone.drop
    with pytest.raises(UserError, match="block 'embed': the model has backbone.embed but no backbone.drop"):
        chain_specs(toy().entries("ToyForLoss"), model)
    with pytest.raises(UserError, match="none of its family's blocks"):
        chain_specs(toy().entries("ToyForLoss"), torch.nn.Linear(2, 2))


def test_sub_layer_blocks_cost_the_same_model_as_layer_blocks() -> None:
    """T5's named sub-layers (self-attention, cross-attention, feed-forward) cut inside each T5Block."""
    cfg = config("2layer-gelu-tied")
    mb = MicroBatch(2, {"source": 7, "target": 5})
    model = T5.build("T5ForConditionalGeneration", cfg, "cpu")
    layers = family_chain(T5, "T5ForConditionalGeneration", cfg, mb, model=model)
    split = family_chain(T5, "T5ForConditionalGeneration", cfg, mb, model=model, sublayers=True)
    names = [block.name for block in split.blocks]
    assert names[1:3] == ["encoder.block.0.layer.0", "encoder.block.0.layer.1"]
    assert [n for n in names if n.startswith("decoder.block.1.")] == [
        "decoder.block.1.layer.0", "decoder.block.1.layer.1", "decoder.block.1.layer.2"]
    assert len(split.blocks) == len(layers.blocks) + 2 * 1 + 3 * 2  # 2 encoder layers x 2, 3 decoder layers x 3
    assert split.total_flops == layers.total_flops
    assert sum(b.param_bytes for b in split.blocks) == sum(b.param_bytes for b in layers.blocks)


# --- inputs and micro-batches ------------------------------------------------------------------------------------


def test_inputs_are_drawn_in_order_from_one_seeded_generator_with_config_bounds() -> None:
    specs = toy().inputs
    cfg = type("Config", (), {"vocab_size": 11})()
    values = make_inputs(specs, cfg, MicroBatch(3, {"tokens": 6}), "cpu", seed=5)
    generator = torch.Generator().manual_seed(5)
    assert torch.equal(values["ids"], torch.randint(1, 11, (3, 6), generator=generator))
    assert torch.equal(values["labels"], torch.randint(0, 11, (3, 6), generator=generator))
    assert values["mask"].dtype == torch.float32 and bool((values["mask"] == 1).all())
    assert values["flag"].shape == (3,) and values["flag"].dtype == torch.long and not values["flag"].any()
    with pytest.raises(UserError, match="has no sequence length 'tokens'"):
        make_inputs(specs, cfg, MicroBatch(3, {"other": 6}), "cpu")
    with pytest.raises(UserError, match="input ids: the config has no integer 'vocab_size'"):
        make_inputs(specs, object(), MicroBatch(3, {"tokens": 6}), "cpu")
    with pytest.raises(UserError, match=r"nothing to draw from \[1, 1\)"):
        make_inputs(specs, type("Config", (), {"vocab_size": 1})(), MicroBatch(3, {"tokens": 6}), "cpu")


def test_a_class_gets_the_inputs_its_forward_takes() -> None:
    assert [s.name for s in accepted(toy().inputs, _ForLoss().forward)] == ["ids", "mask", "labels"]
    assert [s.name for s in accepted(toy().inputs, _Backbone(1, False).forward)] == ["ids", "mask"]
    assert [s.name for s in T5.input_specs("T5EncoderModel")] == ["input_ids", "attention_mask"]
    assert [s.name for s in T5.input_specs("T5Model")] == ["input_ids", "attention_mask", "decoder_input_ids",
                                                          "decoder_attention_mask"]
    assert T5.input_specs("T5ForConditionalGeneration") == T5.definition.inputs


def test_micro_batches_take_the_family_lengths_and_defaults() -> None:
    assert T5.micro_batch(4) == MicroBatch(4, {"source": 512, "target": 128})
    mb = T5.micro_batch(2, {"target": 5})
    assert mb.lengths == {"source": 512, "target": 5} and mb.describe() == "2 x source 512, target 5"
    assert mb.scaled(3) == MicroBatch(6, {"source": 512, "target": 5})
    assert MicroBatch.from_dict(json.loads(json.dumps(mb.to_dict()))) == mb
    with pytest.raises(UserError, match="the t5 family has no sequence length 'sequence' .its lengths: source, target"):
        T5.micro_batch(2, {"sequence": 3})
    with pytest.raises(UserError, match="positive integers"):
        T5.micro_batch(2, {"source": 0})


def test_named_shapes_and_their_misspelled_config_keys() -> None:
    assert T5.config().d_model == 512 and T5.config("t5-large").num_layers == 24
    with pytest.raises(UserError, match="unknown shape 't5-xxl'; known: t5-small, t5-base"):
        T5.config("t5-xxl")
    data = t5_data(T5_TEXT.replace("t5-base = { d_model = 768", "t5-base = { d_modle = 768", 1))
    definition = parse_definition(data, "t5.toml")
    assert definition is not None
    with pytest.raises(UserError, match="shape t5-base of the t5 recipe sets 'd_modle', which T5Config does not have"):
        ModelFamily(definition, "4.5.1").config("t5-base")


def test_the_plan_records_what_train_needs_to_rebuild_model_and_inputs() -> None:
    cfg = config("1layer-relu-tied")
    mb = T5.micro_batch(2, {"source": 7, "target": 5})
    described = json.loads(json.dumps(T5.describe("T5ForConditionalGeneration", cfg, mb, "tiny", 1)))
    torch.manual_seed(0)
    model, rebuilt_config, specs, micro_batch = rebuild(described)
    torch.manual_seed(0)
    reference = T5.build("T5ForConditionalGeneration", cfg, "cpu")
    assert type(model) is type(reference) and micro_batch == mb and rebuilt_config.to_dict() == cfg.to_dict()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    inputs = make_inputs(specs, rebuilt_config, micro_batch, "cpu", seed=3)
    expected = T5.inputs("T5ForConditionalGeneration", cfg, mb, "cpu", seed=3)
    assert inputs.keys() == expected.keys() and all(torch.equal(inputs[k], expected[k]) for k in inputs)
    assert described["layer_lists"] == ["encoder.block", "decoder.block"] and described["output"] == "loss"
    with pytest.raises(UserError, match="does not say how to rebuild its model .no 'inputs'"):
        rebuild({k: v for k, v in described.items() if k != "inputs"})
    with pytest.raises(UserError, match="the plan's module is 'os' but the t5 recipe gives 'generated_models.t5.v4_5"):
        rebuild({**described, "module": "os"})
    with pytest.raises(UserError, match="need a plan of a class whose forward returns its loss; T5Model returns its"):
        rebuild({**described, "class": "T5Model"})


# --- IPU roles, derived ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
def test_t5_ipu_roles_derived_from_the_recipe_equal_the_hand_written_ones(tied: bool) -> None:
    head = ("lm_head",) if tied else ()
    lists = ("encoder.block", "decoder.block")
    sites = {"decoder.embed_tokens": "decoder.block.0"}
    config = {"tie_word_embeddings": tied}
    assert roles_for("t5", "T5ForConditionalGeneration", config, stateless=True) == Roles(
        "stateless", "shared_embed_weight", "call model.make_stateless() first", lists,
        {"shared_embed_weight": ("encoder.embed_tokens", "decoder.embed_tokens", *head)},
        {"shared": "encoder.embed_tokens"}, sites, projection="lm_head")  # the projection, tied or not
    assert roles_for("t5", "T5ForConditionalGeneration", config, stateless=False) == Roles(
        "stateful", "shared.weight", "call model.make_stateful() first (or plan for the stateless form)", lists,
        {"shared.weight": ("shared", *head)}, {"encoder.embed_tokens": "shared", "decoder.embed_tokens": "shared"},
        sites, projection="lm_head")


@pytest.mark.parametrize("value", ["false", 0, None, [True]])
def test_a_tie_flag_that_is_not_a_boolean_is_refused_not_read_as_tied(value: object) -> None:
    # Before: a plan edited to "tie_word_embeddings": "false" was read as tied (a non-empty string is true).
    with pytest.raises(IPUError, match=f"the plan's config.tie_word_embeddings must be true or false, got "
                                       f"{re.escape(repr(value))}"):
        roles_for("t5", "T5ForConditionalGeneration", {"tie_word_embeddings": value}, stateless=True)


def test_roles_follow_the_class_and_a_family_without_shared_weights_has_one_form() -> None:
    encoder = roles_for("t5", "T5EncoderModel", {}, stateless=True)
    assert encoder.shared == {"shared_embed_weight": ("encoder.embed_tokens",)} and encoder.call_sites == {}
    assert encoder.layer_lists == ("encoder.block", "decoder.block")  # a list the class lacks counts no layer
    assert roles_for("t5", None, {}, stateless=True).shared["shared_embed_weight"][-1] == "lm_head"  # default class
    plain = derive_roles(toy(), "ToyForLoss", {}, stateless=True)
    assert (plain.form, plain.marker, plain.shared, plain.layer_lists) == ("plain", None, {}, ("backbone.layers",))


# --- the drafts in docs/families.md against the stock 4.5.1 module trees -------------------------------------------

DRAFTS = dict(re.findall(r"^### Draft: (\w+)\n\n```toml\n(.*?)^```", (REPO / "docs" / "families.md").read_text(),
                         re.S | re.M))
TINY = {  # small enough to run the stock forward in a blink
    "gpt2": dict(n_embd=16, n_layer=2, n_head=2, vocab_size=64, n_positions=32, n_ctx=32),
    "bert": dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24, vocab_size=64,
                 max_position_embeddings=32),
    "roberta": dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24, vocab_size=64,
                    max_position_embeddings=40),
    "bart": dict(d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                 encoder_ffn_dim=24, decoder_ffn_dim=24, vocab_size=64, max_position_embeddings=32),
}
EXPECTED = {
    "GPT2LMHeadModel": ["embed", "transformer.h.0", "transformer.h.1", "final", "lm_head"],
    "GPT2Model": ["embed", "h.0", "h.1", "final"],
    "BertForPreTraining": ["embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1", "pooler", "cls"],
    "BertForMaskedLM": ["embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1", "cls"],
    "BertModel": ["embeddings", "encoder.layer.0", "encoder.layer.1", "pooler"],
    "RobertaForMaskedLM": ["embeddings", "roberta.encoder.layer.0", "roberta.encoder.layer.1", "lm_head"],
    "RobertaModel": ["embeddings", "encoder.layer.0", "encoder.layer.1", "pooler"],
    "BartForConditionalGeneration": ["encoder.embed", "model.encoder.layers.0", "model.encoder.layers.1",
                                     "decoder.embed", "model.decoder.layers.0", "model.decoder.layers.1", "lm_head"],
    "BertForSequenceClassification": ["embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1", "pooler"],
    "BertForTokenClassification": ["embeddings", "bert.encoder.layer.0", "bert.encoder.layer.1"],
    "RobertaForSequenceClassification": ["embeddings", "roberta.encoder.layer.0", "roberta.encoder.layer.1"],
    "RobertaForTokenClassification": ["embeddings", "roberta.encoder.layer.0", "roberta.encoder.layer.1"],
    "GPT2ForSequenceClassification": ["embed", "transformer.h.0", "transformer.h.1", "final"],
    "BartModel": ["encoder.embed", "encoder.layers.0", "encoder.layers.1", "decoder.embed", "decoder.layers.0",
                  "decoder.layers.1"],
}


# Families with a recipe: the docs show their family sections as they are (tested below), and their chains are
# checked against the generated classes (a recipe's chain may list modules the converter adds, e.g. loss_fct).
RECIPES = {"t5": "T5", "gpt2": "GPT-2", "bert": "BERT", "roberta": "RoBERTa"}


def recipe_sections(name: str) -> dict:
    text = (resources.files("families") / "recipe_data" / f"{name}.toml").read_text(encoding="utf-8")
    data = tomllib.loads(text)
    return {key: data[key] for key in ("model", "pipeline", "shapes")}


def test_the_docs_hold_a_draft_per_next_family_and_each_recipes_section_as_it_is() -> None:
    assert sorted(DRAFTS) == sorted(set(TINY) - set(RECIPES))
    text = (REPO / "docs" / "families.md").read_text()
    for name, title in RECIPES.items():
        section = re.search(rf"^## {re.escape(title)} .*?```toml\n(.*?)^```", text, re.S | re.M)
        assert section is not None, title
        assert tomllib.loads(section.group(1)) == recipe_sections(name), title


@pytest.mark.parametrize("name", sorted(TINY))
def test_draft_chains_and_inputs_fit_the_stock_models(name: str) -> None:
    import importlib

    data = tomllib.loads(DRAFTS[name]) if name in DRAFTS else recipe_sections(name)
    classes = list(data["model"]["classes"])
    definition = parse_definition({"family": name, "package": "transformers", "classes": classes, **data},
                                  f"docs/families.md ({name})")
    assert definition is not None
    stock = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    if name in RECIPES:  # the generated classes: the stock module tree plus what the converter adds
        stock = importlib.import_module(f"generated_models.{name}.v4_5_1.modeling_{name}")
    draft = ModelFamily(definition, "4.5.1")
    config_class = getattr(importlib.import_module("transformers"), definition.config_class)
    for shape, kwargs in definition.shapes.items():
        assert not [key for key in kwargs if not hasattr(config_class(), key)], shape
    cfg = config_class(**{**definition.shapes[definition.default_shape], **TINY[name]})
    mb = draft.micro_batch(2, {length: 8 for length in definition.lengths})
    for class_name in classes:
        torch.manual_seed(0)
        model = getattr(stock, class_name)(cfg).train()
        specs = chain_specs(definition.entries(class_name), model)
        assert [spec.name for spec in specs] == EXPECTED[class_name]
        # Blocks start in execution order: each start module is called after the previous one's.
        calls: list[int] = []
        hooks = [m.register_forward_pre_hook(lambda module, args, calls=calls: calls.append(id(module)))
                 for m in model.modules()]
        inputs = make_inputs(accepted(definition.class_inputs(class_name), model.forward), cfg, mb, "cpu")
        output = model(**inputs)
        for hook in hooks:
            hook.remove()
        position = -1
        for spec in specs:
            started = id(model.get_submodule(spec.modules[0]))
            later = [index for index in range(position + 1, len(calls)) if calls[index] == started]
            assert later, f"{class_name}: block {spec.name} does not start after the block before it"
            position = later[0]
        if name in RECIPES:  # the generated class returns its one output
            output = {"loss": output} if definition.classes[class_name].trains else (output,)
        if definition.classes[class_name].trains:
            loss = output["loss"] if isinstance(output, dict) else output.loss
            assert loss.dim() == 0 and torch.isfinite(loss)
        else:
            assert output[0].shape[:2] == (2, 8)
        sub = chain_specs(definition.entries(class_name), copy.deepcopy(model), sublayers=True)
        layer = definition.layer_lists(class_name)[0]
        assert [s.name for s in sub if s.name.startswith(f"{layer}.0.")], class_name


# --- partition-model's sequence lengths -----------------------------------------------------------------------


def test_seq_len_and_the_family_derived_flags_give_the_same_plan(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from partitioning.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(config("1layer-relu-tied").to_json_string())
    base = ["t5", "--version", "4.5.1", "--stages", "2", "--config", str(cfg), "--batch", "2"]
    assert main(base + ["--seq-len", "source=7", "--seq-len", "target=5", "--output", str(tmp_path / "a.json")]) == 0
    assert main(base + ["--source-len", "7", "--target-len", "5", "--output", str(tmp_path / "b.json")]) == 0
    assert main(base + ["--target-len", "5", "--seq-len", "source=7", "--output", str(tmp_path / "c.json")]) == 0
    plans = [(tmp_path / name).read_text() for name in ("a.json", "b.json", "c.json")]
    assert plans[0] == plans[1] == plans[2]
    assert json.loads(plans[0])["model"]["micro_batch"] == {"batch": 2, "lengths": {"source": 7, "target": 5}}
    assert "micro-batch 2 x source 7, target 5," in capsys.readouterr().out
    for extra, message in [(["--seq-len", "sequence=4"], "the t5 family has no sequence length 'sequence'"),
                           (["--seq-len", "source=7", "--source-len", "8"], "'source' given twice: 7 and 8")]:
        assert main(base + extra + ["--output", str(tmp_path / "d.json")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert main(base + ["--seq-len", "source=x", "--output", str(tmp_path / "d.json")]) == 2  # argparse's usage error
    assert "--seq-len: expected NAME=N (a sequence length of the family), got 'source=x'" in capsys.readouterr().err
    assert not (tmp_path / "d.json").exists()
