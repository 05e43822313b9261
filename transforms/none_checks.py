"""``x is None`` -> ``is_None(x)``: None checks a tracer can see."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from transforms.analysis.syntax import code_of
from transforms.library.base import Transform

_IDENTITY = m.Is() | m.IsNot()
_NONE = m.Name("None")
_BOOL = m.Name("True") | m.Name("False")
# Operands a split chain may evaluate twice: doing so has no effect and yields
# the same object, so ``a < b is None`` equals ``a < b and b is None``.
_REPEATABLE = m.Name() | m.Integer() | m.Float() | m.Imaginary() | m.SimpleString() | m.Ellipsis()
_HAS_IDENTITY = m.Comparison(comparisons=[m.ZeroOrMore(), m.ComparisonTarget(_IDENTITY), m.ZeroOrMore()])


@dataclass(frozen=True)
class NoneChecksOptions:
    module: str = "stateless"  # where the generated code imports is_None / is_not_None from


def _is_check_against(target: m.BaseMatcherNode, left: cst.BaseExpression, right: cst.ComparisonTarget) -> bool:
    return m.matches(right.operator, _IDENTITY) and (m.matches(left, target) or m.matches(right.comparator, target))


def _kept_comments(*spaces: cst.BaseParenthesizableWhitespace | None) -> cst.BaseParenthesizableWhitespace:
    """Whitespace carrying the comments found in ``spaces`` (nothing when they hold none)."""
    broken = [space for space in spaces if isinstance(space, cst.ParenthesizedWhitespace)]
    comments = [line.comment for space in broken for line in (space.first_line, *space.empty_lines) if line.comment]
    if not comments:
        return cst.SimpleWhitespace("")
    margin = broken[-1].last_line
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=comments[0]),
        empty_lines=[cst.EmptyLine(whitespace=margin, comment=comment) for comment in comments[1:]],
        indent=broken[-1].indent, last_line=margin)


class NoneChecks(Transform):
    """Rewrite identity comparisons with ``None`` into calls of named helpers.

    A tracer cannot see ``is``: on a Proxy or a wrapped value the comparison is
    evaluated once, in Python, and becomes a constant.  Every ``x is None`` /
    ``x is not None`` (``None`` on either side, any operand) becomes a call of
    ``is_None`` / ``is_not_None``, imported from ``module`` when used; a chained
    comparison is split into an ``and`` where its shared operands can be
    evaluated twice harmlessly (names, literals) and reported otherwise, and
    identity checks against ``True``/``False`` are reported, not changed::

        if past_key_value is not None and key_value_states is None:          # before
        if is_not_None(past_key_value) and is_None(key_value_states):        # after
    """

    DESCRIPTION = "x is None / x is not None -> is_None(x) / is_not_None(x)"

    Options = NoneChecksOptions

    def __init__(self, context: CodemodContext, options: NoneChecksOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.helpers = self.options.module

    def focus(self) -> Iterable[cst.CSTNode]:
        return [node for node in self.index.nodes(cst.Comparison) if m.matches(node, _HAS_IDENTITY)]

    def leave_Comparison(self, original_node: cst.Comparison,
                         updated_node: cst.Comparison) -> cst.BaseExpression:
        operands = [updated_node.left, *(target.comparator for target in updated_node.comparisons)]
        pairs = list(zip(operands, updated_node.comparisons))
        if any(_is_check_against(_BOOL, *pair) for pair in pairs):
            self._report(original_node, "is an identity check against True/False, which a tracer folds into a "
                                        "constant; left as is")
        checks = [_is_check_against(_NONE, *pair) for pair in pairs]
        if not any(checks):
            return updated_node
        if len(pairs) == 1:
            return self._call(*pairs[0]).with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
        shared = [operands[i] for i in range(1, len(pairs)) if checks[i - 1] or checks[i]]
        if not all(m.matches(operand, _REPEATABLE) for operand in shared):
            self._report(original_node, "chains a None check through an operand that splitting would evaluate "
                                        "twice; left as is")
            return updated_node
        return self._split(pairs, checks, updated_node)

    def _call(self, left: cst.BaseExpression, right: cst.ComparisonTarget) -> cst.Call:
        name = "is_None" if isinstance(right.operator, cst.Is) else "is_not_None"
        AddImportsVisitor.add_needed_import(self.context, self.helpers, name)
        operator = right.operator
        comments = _kept_comments(operator.whitespace_before, getattr(operator, "whitespace_between", None),
                                  operator.whitespace_after)
        if m.matches(left, _NONE):
            # The comments sat between ``None`` and the operand: keep them before it.
            return cst.Call(cst.Name(name), [cst.Arg(right.comparator)], whitespace_before_args=comments)
        return cst.Call(cst.Name(name), [cst.Arg(left, whitespace_after_arg=comments)])

    def _split(self, pairs: Sequence[tuple[cst.BaseExpression, cst.ComparisonTarget]], checks: Sequence[bool],
               node: cst.Comparison) -> cst.BooleanOperation:
        pieces: list[cst.BaseExpression] = []
        run: list[cst.ComparisonTarget] = []
        run_left = node.left
        for index, ((left, right), check) in enumerate(zip(pairs, checks)):
            # A middle operand ends one piece and starts the next: the second use gets its own node.
            operand = left.deep_clone() if index else left
            if check:
                if run:
                    pieces.append(cst.Comparison(run_left, run))
                    run = []
                pieces.append(self._call(operand, right))
            else:
                if not run:
                    run_left = operand
                run.append(right)
        if run:
            pieces.append(cst.Comparison(run_left, run))
        joined = pieces[0]
        for piece in pieces[1:]:
            joined = cst.BooleanOperation(joined, cst.And(), piece)
        # ``and`` binds more loosely than the comparison it replaces (``not a is None is b``).
        return joined.with_changes(lpar=node.lpar or [cst.LeftParen()], rpar=node.rpar or [cst.RightParen()])

    def _report(self, node: cst.Comparison, problem: str) -> None:
        self.report(node, f"`{code_of(node)}` {problem}")
