"""Recipe facts: expressions the recipe states a value for, replaced and guarded by a runtime check."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from transforms.analysis.literals import is_constant, literal_value
from transforms.analysis.names import bound_names, names_read
from transforms.analysis.syntax import children, code_of, same_code


def _occurs(expression: cst.BaseExpression, node: cst.CSTNode) -> bool:
    """Whether ``expression`` occurs in ``node`` (a walk over fields; no node is rebuilt)."""
    kind = type(expression)
    pending = [node]
    while pending:
        current = pending.pop()
        if type(current) is kind and same_code(current, expression):
            return True
        pending.extend(children(current))
    return False


def rewrite_facts(facts: Sequence[Fact], body: cst.IndentedBlock) -> tuple[cst.IndentedBlock, list[Fact]]:
    """``body`` with the facts it uses replaced by their values (guarded where they are); the facts used."""
    reads = names_read(body)
    relevant = [fact for fact in facts if fact.names <= reads and _occurs(fact.expression, body)]
    if not relevant:
        return body, []
    rewriter = FactRewriter(relevant, bound_names(body))
    rewritten = body.visit(rewriter)
    assert isinstance(rewritten, cst.IndentedBlock)
    return rewritten, [fact for fact in relevant if fact in rewriter.used]


class Fact:
    """``expression`` always evaluates to the constant ``value``, because ``reason``.

    A guarded fact is checked where it is used (:meth:`guard`); an unguarded one
    is taken on the recipe's word, for values no tracer could check or where a
    check would reject inputs on which both branches agree.  Only an unguarded
    fact may state an expression that is not a literal (a registry lookup that
    resolves to a module-level function): it has no runtime check to compare with.
    """

    def __init__(self, expression: cst.BaseExpression, value: cst.BaseExpression, reason: str,
                 check: cst.BaseExpression | None = None, *, guarded: bool = True, on_device: bool = False) -> None:
        if guarded and not is_constant(value):
            raise ValueError(f"fact {code_of(expression)} = {code_of(value)}: the value is not a literal constant")
        self.expression = expression
        self.value = value
        self.reason = reason
        self.guarded = guarded
        self.check = check  # the guard's condition, when given; else derived from expression and value
        self.on_device = on_device  # the check is a tensor: torch._assert_async, which no tracer turns into a bool
        self.names = names_read(expression)

    def guard(self) -> cst.SimpleStatementLine:
        """``torch._assert(<check>, reason)``, in a form every tracer records.

        ``not x`` would force a Proxy to bool under fx, ``x == False`` is
        unsupported on export's symbolic booleans, and strict export cannot
        trace ``torch.sym_not`` of a plain bool: a false comparison is guarded
        by its inverse, anything else by ``torch.sym_not``.  A recipe's own
        ``check`` replaces the derived condition (``not self.model_parallel``:
        module state is a plain value under every tracer).  A check on tensor
        values (``on_device``) is ``torch._assert_async(<check>, reason)``:
        torch._assert would ask for its bool, which torch.export refuses on data
        (eager CPU raises RuntimeError with the reason at once).
        """
        subject = self.expression.deep_clone()
        value = literal_value(self.value)
        if self.check is not None:
            check: cst.BaseExpression = self.check.deep_clone()
        elif value is True:
            check = subject
        elif value is False and isinstance(subject, cst.Comparison) and _invertible(subject):
            target = subject.comparisons[0]
            inverse = _INVERSE[type(target.operator)]()
            check = subject.with_changes(comparisons=[target.with_changes(operator=inverse)])
        elif value is False:
            check = cst.Call(cst.parse_expression("torch.sym_not"), [cst.Arg(subject)])
        else:
            if not isinstance(subject, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                subject = subject.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            check = cst.Comparison(subject, [cst.ComparisonTarget(cst.Equal(), self.value.deep_clone())])
        call = cst.Call(cst.parse_expression("torch._assert_async" if self.on_device else "torch._assert"),
                        [cst.Arg(check), cst.Arg(cst.SimpleString(repr(self.reason)))])
        return cst.SimpleStatementLine([cst.Expr(call)])


_INVERSE: dict[type, type] = {cst.LessThan: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThan,
                              cst.GreaterThan: cst.LessThanEqual, cst.LessThanEqual: cst.GreaterThan,
                              cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}


def _invertible(node: cst.BaseExpression) -> bool:
    return (isinstance(node, cst.Comparison) and len(node.comparisons) == 1
            and type(node.comparisons[0].operator) in _INVERSE)


_ASSERT_CALLS = (cst.parse_expression("torch._assert"), cst.parse_expression("torch._assert_async"))


class FactRewriter(cst.CSTTransformer):
    """Replace fact expressions by their values, guarding each statement that used one.

    The guard (``torch._assert``, which tracers record) runs just before the
    statement; guards of ``elif`` tests go before the whole ``if``.  A guard
    already emitted at the function's top level, on names never rebound, is not
    repeated.
    """

    def __init__(self, facts: Sequence[Fact], rebound: set[str]) -> None:
        super().__init__()
        self.facts = facts
        self.rebound = rebound
        self.pending: list[list[Fact]] = []
        self.elifs: set[int] = set()
        self.dominating: set[int] = set()
        self.written: set[int] = set()  # targets of assignments: a fact is about the value read
        self.used: list[Fact] = []
        self.matched: dict[int, Fact] = {}  # id(expression) -> the fact it is, found on the way down

    def _opens_statement(self, node: cst.CSTNode) -> bool:
        return isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) and id(node) not in self.elifs

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Call) and any(node.func.deep_equals(call) for call in _ASSERT_CALLS):
            return False
        if isinstance(node, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.Del)):
            self.written.add(id(node.target))
        if isinstance(node, cst.BaseExpression) and id(node) not in self.written:
            fact = next((fact for fact in self.facts if type(node) is type(fact.expression)
                         and same_code(node, fact.expression)), None)
            if fact is not None:  # the outermost match wins: a fact inside it is not used
                self.matched[id(node)] = fact
                return False
        if isinstance(node, cst.If) and isinstance(node.orelse, cst.If):
            self.elifs.add(id(node.orelse))
        if self._opens_statement(node):
            self.pending.append([])
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # noqa: ANN201  # any node back
        fact = self.matched.get(id(original_node))
        if fact is not None:
            self.pending[-1].append(fact)
            self.used.append(fact)
            return fact.value.deep_clone()
        result = super().on_leave(original_node, updated_node)
        if not self._opens_statement(original_node):
            return result
        depth = len(self.pending)
        guards = []
        for fact in dict.fromkeys(self.pending.pop()):
            if not fact.guarded:
                continue
            key = self.facts.index(fact)
            if key in self.dominating:
                continue
            guards.append(fact.guard())
            if depth == 1 and not fact.names & self.rebound:
                self.dominating.add(key)
        if not guards:
            return result
        assert isinstance(result, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
        guards[0] = guards[0].with_changes(leading_lines=result.leading_lines)
        return cst.FlattenSentinel([*guards, result.with_changes(leading_lines=())])
