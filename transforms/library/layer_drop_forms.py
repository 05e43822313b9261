"""The shapes LayerDrop's draw takes in HF layer loops, and what a layer's code must be to become a function.

Shared by ``transforms/layer_drop.py``: the Python draw (``random.uniform(0, 1)`` every call, then
``if self.training and (u < p)``) is found there; the torch draw HF uses from 4.35 on, made in training
only, is found here::

    if self.training:                              # the continue form (BART's decoder)
        dropout_probability = torch.rand([])
        if dropout_probability < self.layerdrop:
            continue

    to_drop = False                                # the flag form (BART's encoder)
    if self.training:
        dropout_probability = torch.rand([])
        if dropout_probability < self.layerdrop:
            to_drop = True
    if to_drop:
        layer_outputs = (None, None)
    else:
        ...                                        # the layer

5.x draws only when the probability is positive (``if self.training and self.layerdrop > 0.0:``, the
draw kind ``"torch_positive"``), and its flag form holds the layer in ``if not to_drop:`` (no ``else``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from transforms.analysis.names import bound_names, names_read
from transforms.analysis.purity import is_pure
from transforms.analysis.syntax import code_of

# What a layer's code may not do once it is the body of a function of its own.
_ESCAPES = m.Return() | m.Yield() | m.Await() | m.Continue() | m.Break() | m.Global() | m.Nonlocal()
_CONTINUE = m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Continue()])]) | m.SimpleStatementSuite(
    body=[m.Continue()])


@dataclass(frozen=True)
class TorchDraw:
    """A torch-draw LayerDrop site: statements ``start`` to ``end`` (exclusive) of the loop body."""

    start: int
    end: int
    variable: str  # ``dropout_probability``
    probability: cst.BaseExpression
    flag: str | None  # the flag form's ``to_drop``; None: the continue form
    layer_branch: int | None  # the flag form's ``if to_drop: ... else: <layer>`` (or ``if not to_drop: <layer>``)
    positive: bool = False  # drawn only when the probability is positive (5.x)


def python_draw_test(me: str, variable: str) -> m.BooleanOperation:
        """``<me>.training and (<variable> < p)`` (also ``p > <variable>``), ``p`` saved."""
        training = m.Attribute(value=m.Name(me), attr=m.Name("training"))
        below = m.Comparison(left=m.Name(variable), comparisons=[
            m.ComparisonTarget(m.LessThan(), m.SaveMatchedNode(m.DoNotCare(), "p"))]) | m.Comparison(
            left=m.SaveMatchedNode(m.DoNotCare(), "p"), comparisons=[m.ComparisonTarget(m.GreaterThan(), m.Name(variable))])
        return m.BooleanOperation(left=training, operator=m.And(), right=below)


def torch_draw(body: Sequence[cst.BaseStatement], index: int, me: str,
               is_draw: Callable[[cst.BaseExpression], bool]) -> TorchDraw | None:
    """The torch-draw site starting at ``body[index]`` of a method whose receiver is ``me``, or None."""
    flag = None
    start = index
    if m.matches(body[index], m.SimpleStatementLine(body=[m.Assign(
            targets=[m.AssignTarget(m.Name())], value=m.Name("False"))])):
        flag = body[index].body[0].targets[0].target.value  # type: ignore[attr-defined]
        index += 1
        if index >= len(body):
            return None
    gate = body[index]
    training = m.Attribute(value=m.Name(me), attr=m.Name("training"))
    if not (m.matches(gate, m.If(test=training | m.BooleanOperation(left=training, operator=m.And()), orelse=None))
            and isinstance(gate, cst.If) and isinstance(gate.body, cst.IndentedBlock) and len(gate.body.body) == 2):
        return None
    draw, branch = gate.body.body
    if not (m.matches(draw, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())])]))
            and isinstance(branch, cst.If) and branch.orelse is None):
        return None
    assign = draw.body[0]  # type: ignore[attr-defined]
    variable = assign.targets[0].target.value
    if not is_draw(assign.value):
        return None
    test = branch.test
    if not (isinstance(test, cst.Comparison) and m.matches(test.left, m.Name(variable)) and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.LessThan)):
        return None
    probability = test.comparisons[0].comparator
    positive = isinstance(gate.test, cst.BooleanOperation)
    if positive and not _positive(gate.test.right, probability):  # type: ignore[attr-defined]
        return None
    if flag is None:
        return TorchDraw(start, index + 1, variable, probability, None, None, positive) if m.matches(
            branch.body, _CONTINUE) else None
    sets_flag = m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Assign(
        targets=[m.AssignTarget(m.Name(flag))], value=m.Name("True"))])])
    if not m.matches(branch.body, sets_flag) or index + 1 >= len(body):
        return None
    layer = body[index + 1]
    if not (m.matches(layer, m.If(test=m.Name(flag), orelse=m.Else()) | m.If(
            test=m.UnaryOperation(operator=m.Not(), expression=m.Name(flag)), orelse=None))
            and isinstance(layer, cst.If) and isinstance(layer.body, cst.IndentedBlock)):
        return None
    return TorchDraw(start, index + 2, variable, probability, flag, index + 1, positive)


def _positive(test: cst.BaseExpression, probability: cst.BaseExpression) -> bool:
    """Whether ``test`` is ``<probability> > 0`` (5.x's ``self.layerdrop > 0.0``)."""
    return (isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and test.left.deep_equals(probability)
            and isinstance(test.comparisons[0].operator, cst.GreaterThan)
            and isinstance(bound := test.comparisons[0].comparator, (cst.Float, cst.Integer)) and bound.evaluated_value == 0)


def carried(skip: Sequence[cst.BaseStatement | cst.BaseSmallStatement], run: Sequence[cst.BaseStatement], reads: set[str],
            binds: set[str]) -> tuple[str | None, str]:
    """``(the variable the layer carries, "")``, or ``(None, why the code cannot become a function of it)``."""
    for statement in skip:
        if not m.matches(statement, m.SimpleStatementLine(body=[m.ZeroOrMore(m.Assign() | m.Pass())])) \
                or not is_pure(statement):
            return None, f"the skipping branch does more than assign values: `{code_of(statement).strip()}`"
    skipped = set().union(*(bound_names(statement) for statement in skip))
    if skipped & reads:
        return None, f"the skipping branch sets {', '.join(sorted(skipped & reads))}, which later code reads"
    if any(m.findall(statement, _ESCAPES) for statement in run):
        return None, "the layer's code returns, yields, breaks, continues or declares a global"
    bound = set().union(*(bound_names(statement) for statement in run))
    carried = sorted(bound & reads)
    if len(carried) != 1:
        return None, (f"the layer's code must carry exactly one variable to the code after it, not "
                      f"{', '.join(carried) or 'none'}")
    (state,) = carried
    if state not in binds:
        return None, f"`{state}` is not bound before the loop"
    local: set[str] = {state}
    for statement in run:  # every other variable must be set before it is read, within one layer
        early = names_read(statement) & (bound - local)
        if not isinstance(statement, cst.SimpleStatementLine):
            early -= bound_names(statement)  # a compound statement may set a name before reading it
        if early:
            return None, f"the layer's code reads {', '.join(sorted(early))} before setting it"
        local |= bound_names(statement)
    return state, ""
