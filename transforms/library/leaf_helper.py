"""Shared machinery of transforms that replace an ``if`` idiom by a call to an fx leaf helper."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from transforms.analysis.syntax import is_docstring, is_import_line
from transforms.library.base import Transform

FLOAT16 = ("torch.float16", "torch.half")


@dataclass(frozen=True)
class LeafHelperOptions:
    module: str = "stateless"  # where the generated code imports the helper from


def block(*statements: m.BaseSmallStatementMatchType) -> m.BaseSuiteMatchType:
    """Matches a suite made of exactly ``statements``, indented or on the header line."""
    return m.OneOf(
        m.IndentedBlock(body=[m.SimpleStatementLine(body=[statement]) for statement in statements]),
        m.SimpleStatementSuite(body=list(statements)),
    )


class LeafHelperRewrite(Transform):
    """Base of transforms that turn an ``if`` statement into ``x = HELPER(...)``.

    A subclass names its helper in ``HELPER`` and implements :meth:`rewrite`.
    This class swaps the statement, keeps its comments, imports the helper from
    the ``module`` option, and adds ``torch.fx.wrap("HELPER")`` once after the
    module's imports: fx patches the globals of the module that calls ``wrap``,
    so the registration must live in the rewritten module itself.
    """

    HELPER: ClassVar[str]

    Options = LeafHelperOptions

    def __init__(self, context: CodemodContext, options: LeafHelperOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.helper_module = self.options.module
        self.rewritten = False

    def rewrite(self, node: cst.If) -> cst.Assign | None:
        """The assignment that replaces ``node`` (an original-tree node), or None to keep it."""
        raise NotImplementedError

    def candidate(self, node: cst.If) -> bool:
        """A cheap test that ``node`` may be the idiom (:meth:`rewrite` decides)."""
        return True

    def focus(self) -> Iterable[cst.CSTNode]:
        return [node for node in self.index.nodes(cst.If) if self.candidate(node)]

    def resolves_to(self, *names: str) -> m.MatchIfTrue:
        """Matches an expression naming one of ``names``, whatever alias imported it."""
        wanted = frozenset(names)

        return m.MatchIfTrue(lambda node: bool(self.qualified_names(node) & wanted))

    def helper_call(self, *args: cst.BaseExpression) -> cst.Call:
        return cst.Call(func=cst.Name(self.HELPER), args=[cst.Arg(arg) for arg in args])

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        # The idioms are compound statements: a simple statement cannot hold one.
        return False

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._rewrite_statements(original_node.body, updated_node.body)
        return updated_node if body is None else updated_node.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._rewrite_statements(original_node.body, updated_node.body)
        if body is not None:
            updated_node = updated_node.with_changes(body=body)
        if not self.rewritten:
            return updated_node
        AddImportsVisitor.add_needed_import(self.context, "torch")
        AddImportsVisitor.add_needed_import(self.context, self.helper_module, self.HELPER)
        return with_fx_wrap(self, original_node, updated_node, self.HELPER)

    def _rewrite_statements(self, original: Sequence[cst.BaseStatement],
                            updated: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement] | None:
        """``updated`` with its idioms replaced, or None when it has none.

        Working on statement lists rather than in ``leave_If`` leaves elifs
        alone, which are no statements of their own.  Each statement keeps its
        index, since nested rewrites replace statements one for one.
        """
        statements = list(updated)
        changed = False
        for index, statement in enumerate(original):
            assignment = self.rewrite(statement) if isinstance(statement, cst.If) else None
            if assignment is not None:
                statements[index] = _replacement(statement, assignment)
                changed = True
        self.rewritten |= changed
        return statements if changed else None



def _fx_wrap(transform: Transform, name: str | None = None) -> m.SimpleStatementLine:
    """Matches a top-level ``torch.fx.wrap("name")`` (any name when None)."""
    string = m.SimpleString() if name is None else m.MatchIfTrue(
        lambda node: isinstance(node, cst.SimpleString) and node.evaluated_value == name)
    wrap = m.MatchIfTrue(lambda node: "torch.fx.wrap" in transform.qualified_names(node))
    return m.SimpleStatementLine(body=[m.Expr(m.Call(func=wrap, args=[m.Arg(string)]))])


def with_fx_wrap(transform: Transform, original_node: cst.Module, updated_node: cst.Module, name: str) -> cst.Module:
    """``updated_node`` with ``torch.fx.wrap("name")`` after its imports, unless it has one.

    fx patches the globals of the module that calls ``wrap``, so the registration
    must live in the rewritten module itself.  Top-level statements of
    ``updated_node`` must correspond one for one to those of ``original_node``.
    """
    statements = original_node.body
    if any(transform.matches(statement, _fx_wrap(transform, name)) for statement in statements):
        return updated_node
    imports = [index for index, statement in enumerate(statements) if is_import_line(statement)]
    position = imports[-1] + 1 if imports else int(bool(statements) and is_docstring(statements[0]))
    wrap = cst.parse_statement(f'torch.fx.wrap("{name}")\n')
    if imports:
        wrap = wrap.with_changes(leading_lines=[cst.EmptyLine()])
    # Join the registrations already there, so that they read as one group.
    while position < len(statements) and transform.matches(statements[position], _fx_wrap(transform)):
        position += 1
        wrap = wrap.with_changes(leading_lines=())
    body = list(updated_node.body)
    body.insert(position, wrap)
    return updated_node.with_changes(body=body)


def _replacement(idiom: cst.If, assignment: cst.Assign) -> cst.SimpleStatementLine:
    """The line that replaces ``idiom``, with the comments that were inside it above."""
    inner = m.findall(idiom.with_changes(leading_lines=()), m.Comment())
    hoisted = [cst.EmptyLine(comment=comment) for comment in inner if isinstance(comment, cst.Comment)]
    return cst.SimpleStatementLine(body=[assignment], leading_lines=[*idiom.leading_lines, *hoisted])
