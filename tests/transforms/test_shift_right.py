from functools import partial
from textwrap import dedent
from types import SimpleNamespace

import libcst as cst
import libcst.matchers as m
import pytest
import torch
from conftest import T5_SOURCE
from support import transform_helpers
from support.transform_helpers import assert_rewrites, assert_unchanged

from transforms.shift_right import FunctionalShiftRight

convert = partial(transform_helpers.run_reporting, FunctionalShiftRight)


def test_t5_shift_right() -> None:
    assert_rewrites(FunctionalShiftRight, """\
        import torch
        def shift(ids, start):
            shifted = ids.new_zeros(ids.shape)
            shifted[..., 1:] = ids[..., :-1].clone()
            shifted[..., 0] = start
            shifted.masked_fill_(shifted == -100, 0)
            return shifted
        """, """\
        import torch
        def shift(ids, start):
            shifted = torch.cat([torch.full_like(ids[..., :1], start), ids[..., :-1]], dim=-1)
            shifted.masked_fill_(shifted == -100, 0)
            return shifted
        """)


def test_bart_spelling_slices_dimension_one() -> None:
    assert_rewrites(FunctionalShiftRight, """\
        import torch
        def shift_tokens_right(input_ids, pad_token_id, decoder_start_token_id):
            out = input_ids.new_zeros(input_ids.shape)
            out[:, 1:] = input_ids[:, :-1].clone()
            out[:, 0] = decoder_start_token_id
            return out
        """, """\
        import torch
        def shift_tokens_right(input_ids, pad_token_id, decoder_start_token_id):
            out = torch.cat([torch.full_like(input_ids[:, :1], decoder_start_token_id), input_ids[:, :-1]], dim=1)
            return out
        """)


def test_attribute_ids_size_call_and_no_clone() -> None:
    assert_rewrites(FunctionalShiftRight, """\
        import torch
        def shift(self):
            s = self.ids.new_zeros(self.ids.size())
            s[..., 1:] = self.ids[..., :-1]
            s[..., 0] = self.config.start
        """, """\
        import torch
        def shift(self):
            s = torch.cat([torch.full_like(self.ids[..., :1], self.config.start), self.ids[..., :-1]], dim=-1)
        """)


def test_comments_of_the_three_statements_are_kept() -> None:
    assert_rewrites(FunctionalShiftRight, """\
        import torch
        def shift(ids, start):
            # shift inputs to the right
            shifted = ids.new_zeros(ids.shape)  # zeros
            # copy
            shifted[..., 1:] = ids[..., :-1].clone()
            shifted[..., 0] = start  # start token
        """, """\
        import torch
        def shift(ids, start):
            # shift inputs to the right
            # zeros
            # copy
            shifted = torch.cat([torch.full_like(ids[..., :1], start), ids[..., :-1]], dim=-1)  # start token
        """)


def test_torch_import_is_added() -> None:
    assert_rewrites(FunctionalShiftRight, """\
        def shift(ids, start):
            shifted = ids.new_zeros(ids.shape)
            shifted[..., 1:] = ids[..., :-1].clone()
            shifted[..., 0] = start
        """, """\
        import torch

        def shift(ids, start):
            shifted = torch.cat([torch.full_like(ids[..., :1], start), ids[..., :-1]], dim=-1)
        """)


def test_tensor_assert_becomes_assert_async() -> None:
    assert_rewrites(FunctionalShiftRight, """\
        import torch as th
        def check(x):
            assert th.all(x >= 0).item(), "negative"
            assert (th.isfinite(x).all() == True).item()
            if x.dim(): assert th.any(x).item(); y = 1
        """, """\
        import torch as th
        import torch

        def check(x):
            torch._assert_async(th.all(x >= 0), "negative")
            torch._assert_async((th.isfinite(x).all() == True))
            if x.dim(): torch._assert_async(th.any(x)); y = 1
        """)


def test_assert_on_unknown_value_is_left_with_a_warning() -> None:
    code = """\
        import numpy as np
        def check(x):
            assert np.all(x).item(), "numpy"
            assert x.item()
            assert x, "no item call"
        """
    assert convert(code) == (dedent(code), [
        "line 3: `assert ….item()` on a value not known to be a tensor is left",
        "line 4: `assert ….item()` on a value not known to be a tensor is left",
    ])


@pytest.mark.parametrize("code", [
    # mixed spellings
    "s = ids.new_zeros(ids.shape)\ns[..., 1:] = ids[:, :-1]\ns[..., 0] = 0\n",
    "s = ids.new_zeros(ids.shape)\ns[:, 1:] = ids[:, :-1]\ns[..., 0] = 0\n",
    # not consecutive
    "s = ids.new_zeros(ids.shape)\nprint(s)\ns[..., 1:] = ids[..., :-1]\ns[..., 0] = 0\n",
    # different tensors, names or offsets
    "s = ids.new_zeros(other.shape)\ns[..., 1:] = ids[..., :-1]\ns[..., 0] = 0\n",
    "s = ids.new_zeros(ids.shape)\ns[..., 1:] = other[..., :-1]\ns[..., 0] = 0\n",
    "s = ids.new_zeros(ids.shape)\nt[..., 1:] = ids[..., :-1]\ns[..., 0] = 0\n",
    "s = ids.new_zeros(ids.shape)\ns[..., 2:] = ids[..., :-2]\ns[..., 0] = 0\n",
    "s = ids.new_zeros(ids.shape)\ns[..., 1:] = ids[..., :-1]\ns[..., 1] = 0\n",
    # ids that a call computes, or that the result shadows
    "s = f().new_zeros(f().shape)\ns[..., 1:] = f()[..., :-1]\ns[..., 0] = 0\n",
    "s = s.new_zeros(s.shape)\ns[..., 1:] = s[..., :-1]\ns[..., 0] = 0\n",
    # a start value that reads the tensor being built
    "s = ids.new_zeros(ids.shape)\ns[..., 1:] = ids[..., :-1]\ns[..., 0] = s[..., 1]\n",
    # the text of the idiom in strings and comments
    'DOC = "s[..., 0] = start"  # s = ids.new_zeros(ids.shape)\n',
])
def test_left_alone(code: str) -> None:
    assert_unchanged(FunctionalShiftRight, code)


def t5_shift_right(source: str) -> str:
    """The source of T5's ``_shift_right`` method, as a module-level function."""
    [model] = [s for s in cst.parse_module(source).body if m.matches(s, m.ClassDef(m.Name("T5PreTrainedModel")))]
    [method] = [s for s in cst.ensure_type(model, cst.ClassDef).body.body
                if m.matches(s, m.FunctionDef(m.Name("_shift_right")))]
    return "import torch\n" + cst.Module([]).code_for_node(method.with_changes(leading_lines=[]))


@pytest.fixture(scope="module")
def t5() -> tuple[str, str]:
    """The T5 source before and after the transform, which must not warn."""
    source = T5_SOURCE.read_text()
    result, warnings = convert(source)
    assert warnings == []
    return source, result


def test_t5_source(t5: tuple[str, str]) -> None:
    source, result = t5
    compile(result, "modeling_t5.py", "exec")
    method = t5_shift_right(result)
    assert "new_zeros" not in method and ".item()" not in method
    assert ("shifted_input_ids = torch.cat([torch.full_like(input_ids[..., :1], decoder_start_token_id), "
            "input_ids[..., :-1]], dim=-1)") in method
    assert ('torch._assert_async(torch.all(shifted_input_ids >= 0), '
            '"Verify that `shifted_input_ids` has only positive values")') in method
    assert "shifted_input_ids.masked_fill_(shifted_input_ids == -100, pad_token_id)" in method
    assert len(result.splitlines()) == len(source.splitlines()) - 2


def test_t5_runtime_equivalence_and_tracing(t5: tuple[str, str]) -> None:
    source, result = t5

    def load(code: str, start: int, pad: int):
        namespace: dict = {}
        exec(code, namespace)
        config = SimpleNamespace(decoder_start_token_id=start, pad_token_id=pad)
        owner = SimpleNamespace(config=config)
        return lambda ids: namespace["_shift_right"](owner, ids)

    before, after = load(t5_shift_right(source), 0, 0), load(t5_shift_right(result), 0, 0)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 32, (3, 7), generator=generator)
    ids[torch.rand(3, 7, generator=generator) < 0.3] = -100
    assert (ids == -100).any()
    expected = before(ids)
    assert torch.equal(after(ids), expected) and after(ids).dtype == expected.dtype == torch.int64

    class Shift(torch.nn.Module):
        def __init__(self, shift) -> None:
            super().__init__()
            self.shift = shift

        def forward(self, ids):
            return self.shift(ids)

    with pytest.raises(TypeError, match="'Proxy' object does not support item assignment"):
        torch.fx.symbolic_trace(Shift(before))
    assert torch.equal(torch.fx.symbolic_trace(Shift(after))(ids), expected)
    exported = torch.export.export(Shift(after), (ids,), strict=False)
    assert torch.equal(exported.module()(ids), expected)

    with pytest.raises(RuntimeError, match="only positive values"):
        load(t5_shift_right(result), 0, -1)(ids)
