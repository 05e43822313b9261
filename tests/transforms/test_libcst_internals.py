"""transforms/library/libcst_internals.py: every private libcst name the project reaches, each named by its test.

A libcst release that renames, removes or reshapes one of them fails here first.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor

from transforms.library.libcst_internals import (
    is_no_op_stub,
    scheduled_import_removals,
    set_unused_imports,
    set_up_without_matchers,
    uses_matcher_decorators,
)


class _Plain(m.MatcherDecoratableTransformer):
    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value=updated_node.value.upper())


class _Decorated(m.MatcherDecoratableTransformer):
    @m.leave(m.Name("x"))
    def rename(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        return updated_node.with_changes(value="y")


def test_no_op_stubs_are_marked() -> None:
    """``_is_no_op``: libcst marks its base classes' empty hooks; an override is not marked."""
    assert cst.CSTTransformer.visit_Name._is_no_op  # type: ignore[attr-defined]
    assert is_no_op_stub(cst.CSTTransformer.visit_Name) and is_no_op_stub(cst.CSTTransformer.leave_Name)
    assert is_no_op_stub(cst.CSTVisitor.visit_Call_func)
    assert not is_no_op_stub(_Plain.leave_Name) and not is_no_op_stub(None)


def test_matcher_state_of_a_class_without_decorators() -> None:
    """``_matchers``, ``_extra_visit_funcs``, ``_extra_leave_funcs``: what ``MatcherDecoratableTransformer``'s
    ``__init__`` leaves is all the state it has, and set so the transformer runs as one built normally."""
    built = _Plain()
    assert not uses_matcher_decorators(built) and uses_matcher_decorators(_Decorated())
    assert (built._matchers, built._extra_visit_funcs, built._extra_leave_funcs) == ({}, {}, {})
    fast = _Plain.__new__(_Plain)
    cst.CSTTransformer.__init__(fast)  # the rest of __init__ (metadata), as Transform runs Codemod.__init__
    set_up_without_matchers(fast)
    assert vars(fast) == vars(built)  # _matchers gathered lazily: read above, so both hold it
    assert cst.parse_module("a = b\n").visit(fast).code == "A = B\n"


def _context() -> CodemodContext:
    context = CodemodContext(full_module_name="pkg.mod", full_package_name="pkg")
    RemoveImportsVisitor.remove_unused_import(context, "os")
    RemoveImportsVisitor.remove_unused_import(context, "typing", "Optional", "Opt")
    return context


def test_scheduled_import_removals() -> None:
    """``RemoveImportsVisitor._get_imports_from_context``: (module, name, alias) as scheduled."""
    assert scheduled_import_removals(_context()) == [("os", None, None), ("typing", "Optional", "Opt")]
    assert scheduled_import_removals(CodemodContext()) == []


def test_told_unused_imports_decide_the_removals() -> None:
    """``RemoveImportsVisitor._unused_imports``: the aliases it removes are those it was told (alias -> statement),
    even where its own metadata would find another unused one."""
    tree = cst.parse_module("import os\nfrom typing import Optional as Opt\n")
    statement = tree.body[0]
    assert isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Import)
    first = statement.body[0]
    told = {first.names[0]: first}

    class Told(RemoveImportsVisitor):
        def visit_Module(self, node: cst.Module) -> None:
            set_unused_imports(self, told)

    assert tree.visit(Told(_context())).code == "from typing import Optional as Opt\n"
    assert RemoveImportsVisitor(_context()).transform_module(tree).code.strip() == ""  # its own: both unused
