"""The options the decoder-only LLMs (llm.toml) brought to existing transforms, on inline before/after code."""

from __future__ import annotations

from support.transform_helpers import assert_rewrites, assert_unchanged, run_reporting

from transforms.drop_forwarded_kwargs import DropForwardedKwargs
from transforms.leaf_calls import LeafCalls
from transforms.single_output import SingleOutput
from transforms.size_varargs import SizeVarargs

LLAMA = "transformers.models.llama.modeling_llama"
KWARGS = ("transformers.utils.TransformersKwargs",)
LAYER = """\
    from torch import nn
    from ...processing_utils import Unpack
    from ...utils import TransformersKwargs

    def eager_attention_forward(module, query, **kwargs: Unpack[TransformersKwargs]):
        return query

    class Attention(nn.Module):
        def forward(self, hidden_states, **kwargs: Unpack[TransformersKwargs]):
            return attention_interface(self, hidden_states, sliding_window=2, **kwargs)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = Attention()

        def forward(self, hidden_states, position_ids=None, **kwargs: Unpack[TransformersKwargs]):
            return self.self_attn(hidden_states, position_ids=position_ids, **kwargs)
"""


def test_unread_keywords_go_with_the_kwargs_that_took_them_and_keep_keeps_a_function_s() -> None:
    assert_rewrites(DropForwardedKwargs, LAYER, """\
        from torch import nn
        from ...processing_utils import Unpack
        from ...utils import TransformersKwargs

        def eager_attention_forward(module, query, **kwargs: Unpack[TransformersKwargs]):
            return query

        class Attention(nn.Module):
            def forward(self, hidden_states):
                return attention_interface(self, hidden_states, sliding_window=2)

        class Layer(nn.Module):
            def __init__(self):
                super().__init__()
                self.self_attn = Attention()

            def forward(self, hidden_states, position_ids=None):
                return self.self_attn(hidden_states)
        """, module_name=LLAMA, annotations=KWARGS, unread=("position_ids",), keep=("eager_attention_forward",))


def test_without_unread_a_keyword_only_kwargs_takes_keeps_the_parameter() -> None:
    result, warnings = run_reporting(DropForwardedKwargs, LAYER, module_name=LLAMA, annotations=KWARGS)
    assert "position_ids=position_ids" in result and "def forward(self, hidden_states, **kwargs" in result
    assert any("`position_ids=`, which only `**kwargs` takes" in w for w in warnings), warnings


def test_an_item_read_as_an_attribute_of_an_annotated_local() -> None:
    assert_rewrites(SingleOutput, """\
        class LlamaForCausalLM(LlamaPreTrainedModel):
            def forward(self, input_ids, labels=None):
                outputs: BaseModelOutputWithPast = self.model(input_ids=input_ids)
                hidden_states = outputs.last_hidden_state
                logits = self.lm_head(hidden_states)
                return CausalLMOutputWithPast(logits=logits)
        """, """\
        class LlamaForCausalLM(LlamaPreTrainedModel):
            def forward(self, input_ids, labels=None):
                outputs: BaseModelOutputWithPast = self.model(input_ids=input_ids)
                hidden_states = outputs
                logits = self.lm_head(hidden_states)
                return logits
        """, module_name=LLAMA, returns={"LlamaForCausalLM": "logits"},
        items={"LlamaForCausalLM": {"self.model": "last_hidden_state"}})


def test_sized_methods_get_their_sizes_as_one_tuple() -> None:
    before = """\
        def forward(self, x, position_ids):
            return self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1).to(x.device)
        """
    assert_rewrites(SizeVarargs, before, """\
        def forward(self, x, position_ids):
            return self.inv_freq[None, :, None].float().expand((position_ids.shape[0], -1, 1)).to(x.device)
        """, sized_methods=("expand",))
    assert_unchanged(SizeVarargs, before)  # not listed: left alone


def test_a_traced_function_referred_to_without_a_call_is_replaced_too() -> None:
    calls = {"transformers.masking_utils.create_causal_mask": "stateless.causal_masks.create_causal_mask",
             "transformers.masking_utils.create_sliding_window_causal_mask":
                 "stateless.causal_masks.create_sliding_window_causal_mask"}
    assert_rewrites(LeafCalls, """\
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        def forward(self, x):
            mask_function = create_causal_mask if self.config.sliding_window is None else create_sliding_window_causal_mask
            return mask_function(config=self.config, inputs_embeds=x)
        """, """\
        import stateless.causal_masks

        def forward(self, x):
            mask_function = stateless.causal_masks.create_causal_mask if self.config.sliding_window is None else stateless.causal_masks.create_sliding_window_causal_mask
            return mask_function(config=self.config, inputs_embeds=x)
        """, module_name=LLAMA, calls=calls, traced=tuple(calls))
