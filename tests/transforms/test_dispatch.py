"""transforms/library/dispatch.py: hooks found by table make the same calls as libcst's own lookup.

A transform's ``visit_*`` / ``leave_*`` hooks (node and attribute hooks, a ``False`` from a visit
hook) give the same tree and the same calls, in the same order, as on libcst's plain transformer;
a transform using libcst's matcher decorators keeps libcst's dispatch and its decorators work.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
import pytest
from libcst.codemod import CodemodContext

from transforms.library.base import Transform

BEFORE = "x = f(a, g(b))\nh(c)\n"


class Hooks:
    """The hooks under test; ``calls`` records them in order."""

    calls: list[tuple[str, ...]]

    def visit_Name(self, node: cst.Name) -> None:
        self.calls.append(("visit", node.value))

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=updated_node.value.upper())

    def visit_Call_func(self, node: cst.Call) -> None:
        self.calls.append(("func",))

    def leave_Call_args(self, node: cst.Call) -> None:
        self.calls.append(("args done",))

    def visit_Arg(self, node: cst.Arg) -> bool:
        return not (isinstance(node.value, cst.Call))  # a nested call's names stay as they are


class TableTransform(Hooks, Transform):
    def __init__(self, context: CodemodContext) -> None:
        super().__init__(context)
        self.calls = []


class LibcstTransformer(Hooks, cst.CSTTransformer):
    def __init__(self) -> None:
        super().__init__()
        self.calls = []


def test_the_same_tree_and_calls_as_libcst() -> None:
    tree = cst.parse_module(BEFORE)
    for _ in range(2):  # the second instance takes the per-class set-up
        ours = TableTransform(CodemodContext())
        assert ours._plain
        reference = LibcstTransformer()
        after = tree.visit(reference).code
        assert after == "X = F(A, g(b))\nH(C)\n"
        assert ours.transform_module(tree).code == after
        assert ours.calls == reference.calls and ("func",) in ours.calls and ("args done",) in ours.calls


class InsideCalls(Transform):
    @m.call_if_inside(m.Call(func=m.Name("h")))
    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=updated_node.value.upper())


def test_matcher_decorators_keep_libcst_dispatch() -> None:
    transform = InsideCalls(CodemodContext())
    assert not transform._plain
    assert transform.transform_module(cst.parse_module(BEFORE)).code == "x = f(a, g(b))\nH(C)\n"
    assert InsideCalls(CodemodContext()).transform_module(cst.parse_module("h(a)\n")).code == "H(A)\n"  # a second instance too


def test_a_hook_replaced_after_use_is_the_one_called(monkeypatch: pytest.MonkeyPatch) -> None:
    tree = cst.parse_module(BEFORE)
    assert TableTransform(CodemodContext()).transform_module(tree).code == "X = F(A, g(b))\nH(C)\n"
    monkeypatch.setattr(TableTransform, "leave_Name", lambda self, original, updated: updated.with_changes(value="n"))
    assert TableTransform(CodemodContext()).transform_module(tree).code == "n = n(n, g(b))\nn(n)\n"
