"""The out_of_place transform: in-place tensor methods used as statements -> out-of-place, assigned back."""

from __future__ import annotations

import pytest
import torch
from support.transform_helpers import assert_left_with_warning, assert_rewrites, assert_unchanged

from transforms import REGISTRY
from transforms.out_of_place import OutOfPlace, OutOfPlaceOptions


def test_registered_under_its_module_name() -> None:
    assert REGISTRY["out_of_place"] is OutOfPlace


def test_bart_causal_mask_and_shifted_labels() -> None:
    assert_rewrites(OutOfPlace, """\
        import torch


        def _make_causal_mask(input_ids_shape, dtype):
            bsz, tgt_len = input_ids_shape
            mask = torch.full((tgt_len, tgt_len), float("-inf"))
            mask_cond = torch.arange(mask.size(-1))
            mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)  # keeps its comment
            return mask.to(dtype)


        class Model:
            def _shift_right(self, input_ids, pad_token_id):
                shifted = torch.cat([torch.full_like(input_ids[..., :1], 0), input_ids[..., :-1]], dim=-1)
                if pad_token_id is not None:
                    shifted.masked_fill_(shifted == -100, pad_token_id)
                return shifted
        """, """\
        import torch


        def _make_causal_mask(input_ids_shape, dtype):
            bsz, tgt_len = input_ids_shape
            mask = torch.full((tgt_len, tgt_len), float("-inf"))
            mask_cond = torch.arange(mask.size(-1))
            mask = mask.masked_fill(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)  # keeps its comment
            return mask.to(dtype)


        class Model:
            def _shift_right(self, input_ids, pad_token_id):
                shifted = torch.cat([torch.full_like(input_ids[..., :1], 0), input_ids[..., :-1]], dim=-1)
                if pad_token_id is not None:
                    shifted = shifted.masked_fill(shifted == -100, pad_token_id)
                return shifted
        """)


def test_arithmetic_results_and_successive_calls() -> None:
    assert_rewrites(OutOfPlace, """\
        def positions(attention_mask, index):
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids.masked_fill_(attention_mask == 0, 1); position_ids.index_fill_(0, index, 0)
            return position_ids
        """, """\
        def positions(attention_mask, index):
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids = position_ids.masked_fill(attention_mask == 0, 1); position_ids = position_ids.index_fill(0, index, 0)
            return position_ids
        """)


def test_nothing_to_rewrite_is_a_no_op() -> None:
    assert_unchanged(OutOfPlace, """\
        import torch


        def f(x, m):
            y = x.masked_fill(m, 0)  # already out of place
            z = torch.zeros(3)
            z.add_(1)  # not one of the methods: out of place it would promote dtypes
            module.weight.data.normal_(mean=0.0, std=1.0)
            return y, z
        """)


@pytest.mark.parametrize("code,reason", [
    ("def f(x, m):\n    x.masked_fill_(m, 0)\n    return x\n", "x is a parameter"),
    ("def f(self, m):\n    self.mask.masked_fill_(m, 0)\n", "self.mask is not a variable"),
    ("def f(y, m):\n    x = y[:, 1:]\n    x.masked_fill_(m, 0)\n    return y\n", "may share memory with another tensor (y[:, 1:])"),
    ("def f(y, m):\n    x = y.to(torch.float32)\n    x.masked_fill_(m, 0)\n    return y\n", "may share memory"),
    ("def f(m):\n    x = torch.zeros(3)\n    v = x.view(3)\n    x.masked_fill_(m, 0)\n    return v\n",
     "x may be aliased by v = x.view(3)"),
    ("def f(m, out):\n    x = torch.zeros(3)\n    out.append(x)\n    x.masked_fill_(m, 0)\n", "aliased by out.append(x)"),
    ("def f(m, c):\n    x = torch.zeros(3)\n    if c:\n        x = torch.ones(3)\n    x.masked_fill_(m, 0)\n    return x\n",
     "bound in a branch"),
    ("def f(ms):\n    x = torch.zeros(3)\n    for m in ms:\n        x.masked_fill_(m, 0)\n    return x\n", "inside a loop"),
    ("def f(m):\n    x = torch.zeros(3)\n    g = lambda: x\n    x.masked_fill_(m, 0)\n    return g\n", "nested scope"),
    ("x = torch.zeros(3)\nx.masked_fill_(m, 0)\n", "not a variable of the function"),
], ids=["parameter", "attribute", "view", "maybe-self", "aliased-view", "stored", "branch", "loop", "closure",
        "module-level"])
def test_left_in_place_with_a_warning_where_another_reference_may_see_the_change(code: str, reason: str) -> None:
    assert_left_with_warning(OutOfPlace, "import torch\n" + code, reason)


def test_methods_option_names_the_methods() -> None:
    assert_rewrites(OutOfPlace, """\
        import torch
        def f(m, i, src):
            x = torch.zeros(3, 4)
            x.scatter_(1, i, src)
            x.masked_fill_(m, 0)
            return x
        """, """\
        import torch
        def f(m, i, src):
            x = torch.zeros(3, 4)
            x = x.scatter(1, i, src)
            x.masked_fill_(m, 0)
            return x
        """, methods=["scatter_"])


@pytest.mark.parametrize("method", OutOfPlaceOptions().methods)
def test_each_default_method_out_of_place_returns_what_in_place_leaves(method: str) -> None:
    # An int64 receiver filled with a float value: in place casts to the receiver's dtype; a method whose
    # out-of-place form promoted (add) would return float64 here.
    x = torch.arange(12, dtype=torch.int64).view(3, 4)
    args = {"masked_fill_": (x > 4, 2.5), "index_fill_": (1, torch.tensor([0, 2]), 2.5)}[method]
    in_place = x.clone()
    getattr(in_place, method)(*args)
    out_of_place = getattr(x, method[:-1])(*args)
    assert out_of_place.dtype == in_place.dtype and torch.equal(out_of_place, in_place)
    assert not torch.equal(in_place, x)
