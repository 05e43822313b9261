"""The transforms later transformers releases need (recipe steps keyed by release range in t5.toml)."""

from __future__ import annotations

import pytest
from libcst.codemod import CodemodContext
from support.transform_helpers import assert_rewrites, assert_unchanged

from transforms.drop_decorators import DropDecorators
from transforms.dtype_branch_leaf import DtypeBranchLeaf
from transforms.item_assignment import ItemAssignment
from transforms.leaf_calls import LeafCalls
from transforms.library.base import EXPORTED_CLASSES
from transforms.optional_imports import OptionalImports
from transforms.prune_classes import PruneClasses
from transforms.replace_bases import ReplaceBases

DECORATORS = ("transformers.utils.auto_docstring", "transformers.utils.deprecation.deprecate_kwarg")


def test_drop_decorators_by_qualified_name_called_or_not() -> None:
    assert_rewrites(DropDecorators, """\
        from transformers.utils import auto_docstring
        from transformers.utils.deprecation import deprecate_kwarg as renamed
        import functools

        @auto_docstring
        class A:
            @renamed("a", version="5")
            @functools.wraps(f)
            def forward(self, x):
                return x
        """, """\
        from transformers.utils import auto_docstring
        from transformers.utils.deprecation import deprecate_kwarg as renamed
        import functools

        class A:
            @functools.wraps(f)
            def forward(self, x):
                return x
        """, names=DECORATORS)


def test_drop_decorators_leaves_a_same_named_local_decorator() -> None:
    assert_unchanged(DropDecorators, """\
        def auto_docstring(f):
            return f

        @auto_docstring
        def g():
            pass
        """, names=DECORATORS)


def test_replace_bases() -> None:
    bases = {"transformers.modeling_layers.GradientCheckpointingLayer": "torch.nn.Module"}
    assert_rewrites(ReplaceBases, """\
        from transformers.modeling_layers import GradientCheckpointingLayer
        import torch

        class Block(GradientCheckpointingLayer):
            pass
        """, """\
        from transformers.modeling_layers import GradientCheckpointingLayer
        import torch

        class Block(torch.nn.Module):
            pass
        """, bases=bases)
    assert_unchanged(ReplaceBases, "import torch\n\nclass Block(torch.nn.Module):\n    pass\n", bases=bases)


def test_optional_imports_keep_the_fallback() -> None:
    assert_rewrites(OptionalImports, """\
        import torch

        class T5LayerNorm(torch.nn.Module):
            pass

        try:
            from apex.normalization import FusedRMSNorm

            T5LayerNorm = FusedRMSNorm  # noqa
            logger.info("Discovered apex.normalization.FusedRMSNorm")
        except ImportError:
            pass
        except Exception:
            logger.warning("discovered apex but it failed to load")
            pass
        """, """\
        import torch

        class T5LayerNorm(torch.nn.Module):
            pass
        """, modules=("apex",))


def test_optional_imports_leave_other_packages() -> None:
    assert_unchanged(OptionalImports, """\
        try:
            import numpy
        except ImportError:
            numpy = None
        """, modules=("apex",))


def test_leaf_calls() -> None:
    assert_rewrites(LeafCalls, """\
        import torch

        class M(torch.nn.Module):
            def forward(self, x):
                return torch.finfo(x.dtype).min + x
        """, """\
        import torch
        from stateless import finfo

        torch.fx.wrap("finfo")

        class M(torch.nn.Module):
            def forward(self, x):
                return finfo(x.dtype).min + x
        """, calls={"torch.finfo": "stateless.finfo"})


def test_leaf_calls_traced_helper_replaces_the_function_and_its_import() -> None:
    assert_rewrites(LeafCalls, """\
        import torch
        from transformers.masking_utils import create_bidirectional_mask, create_causal_mask

        class M(torch.nn.Module):
            def forward(self, x, m):
                a = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=m)
                return a + create_bidirectional_mask(self.config, x, m)
        """, """\
        import torch
        from transformers.masking_utils import create_bidirectional_mask
        import stateless.masks

        class M(torch.nn.Module):
            def forward(self, x, m):
                a = stateless.masks.create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=m)
                return a + create_bidirectional_mask(self.config, x, m)
        """, calls={"transformers.masking_utils.create_causal_mask": "stateless.masks.create_causal_mask"},
        traced=["transformers.masking_utils.create_causal_mask"])


def test_leaf_calls_traced_names_a_mapped_function() -> None:
    from common.schema import OptionError
    with pytest.raises(OptionError, match="traced"):
        LeafCalls(CodemodContext(), calls={"torch.finfo": "stateless.finfo"}, traced=["torch.iinfo"])


def test_item_assignment_spells_out_the_index() -> None:
    assert_rewrites(ItemAssignment, """\
        import torch

        class M(torch.nn.Module):
            def forward(self, mask, x):
                mask[:, :, :, :4] = x
                return mask
        """, """\
        import torch
        from stateless import setitem

        torch.fx.wrap("setitem")

        class M(torch.nn.Module):
            def forward(self, mask, x):
                mask = setitem(mask, (slice(None, None), slice(None, None), slice(None, None), slice(None, 4)), x)
                return mask
        """)
    assert_unchanged(ItemAssignment, "x = {}\nx['a'] = 1\n")


def test_prune_classes_keeps_what_the_exported_classes_use() -> None:
    assert_rewrites(PruneClasses, """\
        import torch

        class Used(torch.nn.Module):
            pass

        class Head(torch.nn.Module):
            pass

        class Model(torch.nn.Module):
            def __init__(self):
                self.u = Used()

        class ForQA(Model):
            def __init__(self):
                self.h = Head()
        """, """\
        import torch

        class Used(torch.nn.Module):
            pass

        class Model(torch.nn.Module):
            def __init__(self):
                self.u = Used()
        """, scratch={EXPORTED_CLASSES: ("Model",)})


def test_dtype_branch_becomes_an_fx_leaf() -> None:
    """T5LayerNorm's half-precision cast as written from 4.17 (``in [float16, bfloat16]``)."""
    assert_rewrites(DtypeBranchLeaf, """\
        import torch

        class Norm(torch.nn.Module):
            def forward(self, hidden_states):
                hidden_states = hidden_states * 2
                if self.weight.dtype in [torch.float16, torch.bfloat16]:
                    hidden_states = hidden_states.to(self.weight.dtype)
                return self.weight * hidden_states
        """, """\
        import torch

        def Norm_forward_dtype_branch(hidden_states, weight):
            if weight.dtype in [torch.float16, torch.bfloat16]:
                hidden_states = hidden_states.to(weight.dtype)
            return hidden_states


        torch.fx.wrap("Norm_forward_dtype_branch")


        class Norm(torch.nn.Module):
            def forward(self, hidden_states):
                hidden_states = hidden_states * 2
                hidden_states = Norm_forward_dtype_branch(hidden_states, self.weight)
                return self.weight * hidden_states
        """)


def test_a_branch_on_values_is_not_a_dtype_branch() -> None:
    assert_unchanged(DtypeBranchLeaf, """\
        import torch

        class Norm(torch.nn.Module):
            def forward(self, x):
                if x.sum() > 0:
                    x = x * 2
                return x
        """)
