"""Shift tokens right without item assignment, and check tensors without ``.item()``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor
from libcst.helpers import parse_template_expression, parse_template_statement

from transforms.analysis.names import imports_module
from transforms.analysis.syntax import root_name
from transforms.library.base import Transform

_Simple = TypeVar("_Simple", cst.SimpleStatementLine, cst.SimpleStatementSuite)
# A plain ``a.b.c`` chain: evaluating it twice is as good as once.
_REFERENCE = m.MatchIfTrue(lambda node: root_name(node) is not None)
_NEW_ZEROS = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(target=m.SaveMatchedNode(m.Name(), "shifted"))],
    value=m.Call(func=m.Attribute(value=m.SaveMatchedNode(_REFERENCE, "ids"), attr=m.Name("new_zeros")),
                 args=[m.Arg(keyword=None, star="", value=m.SaveMatchedNode(
                     m.Attribute(value=_REFERENCE, attr=m.Name("shape"))
                     | m.Call(func=m.Attribute(value=_REFERENCE, attr=m.Name("size")), args=[]), "shape"))]))])
# The leading index of the ``...`` and ``:`` spellings, with the dimension each slices.
_SPELLINGS = (
    (m.SubscriptElement(slice=m.Index(value=m.Ellipsis())), "...", "-1"),
    (m.SubscriptElement(slice=m.Slice(lower=None, upper=None, step=None)), ":", "1"),
)
_ASSERT_ITEM = m.Assert(test=m.Call(
    func=m.Attribute(value=m.SaveMatchedNode(m.DoNotCare(), "tensor"), attr=m.Name("item")), args=[]))
_MINUS_ONE = m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1"))


def _copy(shifted: str, same_ids: m.MatchIfTrue, lead: m.SubscriptElement) -> m.SimpleStatementLine:
    """``shifted[lead, 1:] = ids[lead, :-1]``, with or without ``.clone()``."""
    source = m.Subscript(value=same_ids, slice=[lead, m.SubscriptElement(
        slice=m.Slice(lower=None, upper=_MINUS_ONE, step=None))])
    return m.SimpleStatementLine(body=[m.Assign(
        targets=[m.AssignTarget(target=m.Subscript(value=m.Name(shifted), slice=[lead, m.SubscriptElement(
            slice=m.Slice(lower=m.Integer("1"), upper=None, step=None))]))],
        value=source | m.Call(func=m.Attribute(value=source, attr=m.Name("clone")), args=[]))])


def _start(shifted: str, lead: m.SubscriptElement) -> m.SimpleStatementLine:
    """``shifted[lead, 0] = start``."""
    return m.SimpleStatementLine(body=[m.Assign(
        targets=[m.AssignTarget(target=m.Subscript(value=m.Name(shifted), slice=[
            lead, m.SubscriptElement(slice=m.Index(value=m.Integer("0")))]))],
        value=m.SaveMatchedNode(m.DoNotCare(), "start"))])


def _comment_lines(statements: Sequence[cst.SimpleStatementLine]) -> list[cst.EmptyLine]:
    """The comments of statements merged into the first one, in source order."""
    lines: list[cst.EmptyLine] = []
    for index, statement in enumerate(statements):
        if index:
            lines += [line for line in statement.leading_lines if line.comment is not None]
        if index < len(statements) - 1 and statement.trailing_whitespace.comment is not None:
            lines.append(cst.EmptyLine(comment=statement.trailing_whitespace.comment))
    return lines


class FunctionalShiftRight(Transform):
    """Rewrite HF's "shift tokens right" and ``assert tensor.item()`` into traceable code.

    The idiom writes into a fresh tensor by item assignment, which torch.fx
    cannot record, and its final ``assert <tensor>.item()`` needs the data,
    which no tracer has.  Three consecutive statements (with ``[...,`` or
    ``[:,`` indexing, any names) become one ``torch.cat`` with the same values,
    dtype and device, and the assert becomes ``torch._assert_async``, which
    keeps the check in eager mode and traces; only asserts whose operand is
    built from ``torch`` calls are rewritten, other ``.item()`` asserts are
    reported and left::

        shifted = ids.new_zeros(ids.shape)                                   # before
        shifted[..., 1:] = ids[..., :-1].clone()
        shifted[..., 0] = start
        assert torch.all(shifted >= 0).item(), "negative ids"

        shifted = torch.cat([torch.full_like(ids[..., :1], start), ids[..., :-1]], dim=-1)  # after
        torch._assert_async(torch.all(shifted >= 0), "negative ids")
    """

    DESCRIPTION = "shift-right item assignment -> torch.cat; assert t.item() -> torch._assert_async(t)"
    _has_torch = False

    def focus(self) -> Iterable[cst.CSTNode]:
        """Lines holding an assert, and the first line of each possible shift (``x = ids.new_zeros(...)``)."""
        index = self.index
        lines = [index.parent(node) for node in index.nodes(cst.Assert)]
        for call in index.nodes(cst.Call):
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "new_zeros":
                lines.append(index.enclosing(call, cst.SimpleStatementLine))
        return [line for line in lines if line is not None]

    def visit_Module(self, node: cst.Module) -> bool:
        # Scheduling an import costs a whole extra pass: skip it where ``torch`` is already there.
        self._has_torch = imports_module(node, "torch")
        return True

    def _need_torch(self) -> None:
        if not self._has_torch:
            AddImportsVisitor.add_needed_import(self.context, "torch")

    # Both rewrites replace whole statements: nothing inside one needs a visit.
    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return False

    def visit_SimpleStatementSuite(self, node: cst.SimpleStatementSuite) -> bool:
        return False

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        return self._check_asserts(updated_node)

    def leave_SimpleStatementSuite(self, original_node: cst.SimpleStatementSuite,
                                   updated_node: cst.SimpleStatementSuite) -> cst.SimpleStatementSuite:
        return self._check_asserts(updated_node)

    def _check_asserts(self, node: _Simple) -> _Simple:
        body = [self._checked(statement) for statement in node.body]
        if all(new is old for new, old in zip(body, node.body)):
            return node
        return node.with_changes(body=body)

    def _checked(self, statement: cst.BaseSmallStatement) -> cst.BaseSmallStatement:
        found = m.extract(statement, _ASSERT_ITEM)
        if found is None:
            return statement
        if not self._is_tensor(found["tensor"]):
            self.report(statement, "`assert ….item()` on a value not known to be a tensor is left")
            return statement
        self._need_torch()
        if statement.msg is None:
            call = parse_template_expression("torch._assert_async({tensor})", tensor=found["tensor"])
        else:
            call = parse_template_expression("torch._assert_async({tensor}, {msg})", tensor=found["tensor"],
                                             msg=statement.msg)
        return cst.Expr(value=call, semicolon=statement.semicolon)

    def _is_tensor(self, node: cst.BaseExpression) -> bool:
        """Built by a ``torch`` function, a method of such a result, or an operator on one."""
        if isinstance(node, cst.Call):
            names = self.qualified_names(node.func)
            if any(name.startswith("torch.") for name in names):
                return True
            return isinstance(node.func, cst.Attribute) and self._is_tensor(node.func.value)
        if isinstance(node, cst.Comparison):
            return self._is_tensor(node.left) or any(self._is_tensor(c.comparator) for c in node.comparisons)
        if isinstance(node, cst.BinaryOperation):
            return self._is_tensor(node.left) or self._is_tensor(node.right)
        if isinstance(node, cst.UnaryOperation):
            return self._is_tensor(node.expression)
        return False

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock,
                            updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._shift_rights(updated_node.body)
        return updated_node if body is updated_node.body else updated_node.with_changes(body=body)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._shift_rights(updated_node.body)
        return updated_node if body is updated_node.body else updated_node.with_changes(body=body)

    def _shift_rights(self, body: Sequence[cst.BaseStatement]) -> Sequence[cst.BaseStatement]:
        result: list[cst.BaseStatement] = []
        index = 0
        while index < len(body):
            rewritten = self._shift_right(body[index:index + 3])
            if rewritten is None:
                result.append(body[index])
                index += 1
            else:
                result.append(rewritten)
                index += 3
        return body if len(result) == len(body) else result

    def _shift_right(self, statements: Sequence[cst.BaseStatement]) -> cst.SimpleStatementLine | None:
        if len(statements) < 3:
            return None
        first = m.extract(statements[0], _NEW_ZEROS)
        if first is None:
            return None
        shifted, ids = first["shifted"].value, first["ids"]
        shape = first["shape"]
        owner = shape.value if isinstance(shape, cst.Attribute) else shape.func.value
        if not owner.deep_equals(ids) or root_name(ids) == shifted:
            return None
        same_ids = m.MatchIfTrue(ids.deep_equals)
        for lead, spelling, dim in _SPELLINGS:
            if not m.matches(statements[1], _copy(shifted, same_ids, lead)):
                continue
            last = m.extract(statements[2], _start(shifted, lead))
            start = None if last is None else last["start"]
            if start is None or m.findall(start, m.Name(shifted)) or m.matches(start, m.Tuple(lpar=[])):
                return None
            self._need_torch()
            template = (f"{{shifted}} = torch.cat([torch.full_like({{ids}}[{spelling}, :1], {{start}}), "
                        f"{{ids}}[{spelling}, :-1]], dim={dim})")
            statement = parse_template_statement(template, shifted=cst.Name(shifted), ids=ids, start=start)
            return statement.with_changes(
                leading_lines=[*statements[0].leading_lines, *_comment_lines(statements)],
                trailing_whitespace=statements[2].trailing_whitespace)
        return None
