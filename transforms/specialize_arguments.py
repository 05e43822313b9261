"""Specialize optional arguments to constants and fold away the code they guard."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence

import libcst as cst

from transforms.base import Transform
from transforms.folding import (
    ExpressionFolder,
    Known,
    bound_names,
    is_constant,
    module_imports,
    is_pure,
    literal_value,
    names_read,
    simplify_condition,
    truth,
)


class _Bail(Exception):
    """The function uses a construct whose scoping the folder does not model."""


def _name_targets(targets: Iterable[cst.BaseExpression]) -> set[str] | None:
    """The names assigned when every target is a name or a tuple of names, else None."""
    names: set[str] = set()
    for target in targets:
        if isinstance(target, cst.Name):
            names.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            inner = _name_targets(element.value for element in target.elements)
            if inner is None:
                return None
            names |= inner
        else:
            return None
    return names


def _drop_items(items: Sequence[cst.CSTNode], keep: Sequence[bool]) -> list[cst.CSTNode]:
    """Remove items from a comma-separated list, keeping the original trailing-comma style."""
    kept = [item for item, flag in zip(items, keep) if flag]
    if kept and not keep[-1]:
        # The new last item takes the old last one's comma, and with it the
        # whitespace before the closing parenthesis.
        kept[-1] = kept[-1].with_changes(comma=items[-1].comma)
    return kept


def _indented(statements: list[cst.BaseStatement], block: cst.BaseSuite) -> cst.BaseSuite:
    body = statements or [cst.SimpleStatementLine([cst.Pass()])]
    if isinstance(block, cst.IndentedBlock):
        return block.with_changes(body=body)
    return cst.IndentedBlock(body=body)


class _FunctionFolder:
    """Flow-sensitive constant propagation over one function body.

    The environment maps names to what is known about them at the current
    point.  Branches are merged conservatively, loops invalidate every name
    they bind, and a name whose entry value (the removed parameter) might
    still be read unsubstituted is reported in ``observed`` so the caller can
    bind it at entry: reassignment never makes folding unsound.
    """

    def __init__(self, pure_methods: frozenset[str]) -> None:
        self.pure_methods = pure_methods
        self.observed: set[str] = set()

    def fold(self, expr: cst.BaseExpression, env: dict[str, Known], condition: bool = False) -> cst.BaseExpression:
        folder = ExpressionFolder(env)
        result = expr.visit(folder)
        self.observed |= folder.observed
        return simplify_condition(result, self.pure_methods) if condition else result

    def _observe(self, node: cst.CSTNode, env: dict[str, Known]) -> None:
        self.observed |= {name for name in names_read(node) if name in env and env[name].from_entry}

    @staticmethod
    def _merge(*envs: dict[str, Known] | None) -> dict[str, Known]:
        live = [env for env in envs if env is not None]
        merged: dict[str, Known] = {}
        for name in set().union(*live):
            states = [env.get(name, Known(None, False)) for env in live]
            first = states[0].value
            same = first is not None and all(s.value is not None and s.value.deep_equals(first) for s in states)
            merged[name] = Known(first if same else None, any(s.from_entry for s in states))
        return merged

    @staticmethod
    def _forget(env: dict[str, Known], names: set[str]) -> dict[str, Known]:
        forgotten = dict(env)
        for name in names:
            forgotten[name] = Known(None, env[name].from_entry if name in env else False)
        return forgotten

    @staticmethod
    def _rebind(env: dict[str, Known], names: set[str]) -> dict[str, Known]:
        """An assignment ends both the constant and the entry value of what it binds."""
        return {**env, **{name: Known(None, False) for name in names}}

    def block(self, statements: Sequence[cst.BaseStatement],
              env: dict[str, Known]) -> tuple[list[cst.BaseStatement], dict[str, Known], bool]:
        out: list[cst.BaseStatement] = []
        for statement in statements:
            new, env, terminated = self.statement(statement, env)
            out.extend(new)
            if terminated:
                return out, env, True
        return out, env, False

    def statement(self, stmt: cst.BaseStatement,
                  env: dict[str, Known]) -> tuple[list[cst.BaseStatement], dict[str, Known], bool]:
        if isinstance(stmt, cst.SimpleStatementLine):
            kept: list[cst.BaseSmallStatement] = []
            terminated = False
            for small in stmt.body:
                new_small, env, terminated = self.small(small, env)
                if new_small is not None:
                    kept.append(new_small)
                if terminated:
                    break
            if not kept:
                return [], env, terminated
            kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
            return [stmt.with_changes(body=kept)], env, terminated
        if isinstance(stmt, cst.If):
            return self.if_statement(stmt, env)
        if isinstance(stmt, (cst.For, cst.While)):
            return self.loop(stmt, env)
        if isinstance(stmt, cst.With):
            items = [item.with_changes(item=self.fold(item.item, env)) for item in stmt.items]
            env = self._forget(env, set().union(*(bound_names(item) for item in stmt.items)))
            body, env, terminated = self.block(stmt.body.body, env)
            return [stmt.with_changes(items=items, body=_indented(body, stmt.body))], env, terminated
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            # Nested scopes run later and see the final bindings: substitute nothing inside.
            self._observe(stmt, env)
            return [stmt], self._forget(env, {stmt.name.value}), False
        # try/match and anything else: keep as is, forget what it binds.
        self._observe(stmt, env)
        return [stmt], self._forget(env, bound_names(stmt)), False

    def loop(self, stmt: cst.For | cst.While,
             env: dict[str, Known]) -> tuple[list[cst.BaseStatement], dict[str, Known], bool]:
        """Fold a loop under an environment that forgets whatever the loop body rebinds.

        What the body rebinds is only known after folding it (folding removes
        dead assignments), so fold again, forgetting less, until that settles.
        """
        observed = set(self.observed)
        forget = bound_names(stmt)
        while True:
            self.observed = set(observed)
            loop_env = self._forget(env, forget)
            if isinstance(stmt, cst.For):
                head = {"iter": self.fold(stmt.iter, env)}
            else:
                head = {"test": self.fold(stmt.test, loop_env, condition=True)}
            body, _, _ = self.block(stmt.body.body, dict(loop_env))
            changes = dict(head, body=_indented(body, stmt.body))
            if stmt.orelse is not None:
                orelse, _, _ = self.block(stmt.orelse.body.body, dict(loop_env))
                changes["orelse"] = stmt.orelse.with_changes(body=_indented(orelse, stmt.orelse.body))
            folded = stmt.with_changes(**changes)
            rebinds = bound_names(folded)
            if rebinds >= forget:
                return [folded], loop_env, False
            forget = rebinds

    def if_statement(self, stmt: cst.If,
                     env: dict[str, Known]) -> tuple[list[cst.BaseStatement], dict[str, Known], bool]:
        test = self.fold(stmt.test, env, condition=True)
        outcome = truth(test)
        if outcome is not None:
            if outcome:
                chosen, env, terminated = self.block(stmt.body.body, env)
            elif isinstance(stmt.orelse, cst.If):
                chosen, env, terminated = self.statement(stmt.orelse, env)
            elif isinstance(stmt.orelse, cst.Else):
                chosen, env, terminated = self.block(stmt.orelse.body.body, env)
            else:
                return [], env, False
            if chosen and stmt.leading_lines:
                chosen[0] = chosen[0].with_changes(leading_lines=stmt.leading_lines)
            return chosen, env, terminated
        body, body_env, body_ends = self.block(stmt.body.body, dict(env))
        orelse: cst.If | cst.Else | None = None
        else_env, else_ends = env, False
        if isinstance(stmt.orelse, cst.If):
            branch, else_env, else_ends = self.statement(stmt.orelse, dict(env))
            if len(branch) == 1 and isinstance(branch[0], cst.If):
                orelse = branch[0].with_changes(leading_lines=())
            elif branch:
                orelse = cst.Else(body=cst.IndentedBlock(body=branch))
        elif isinstance(stmt.orelse, cst.Else):
            branch, else_env, else_ends = self.block(stmt.orelse.body.body, dict(env))
            if branch:
                orelse = stmt.orelse.with_changes(body=_indented(branch, stmt.orelse.body))
        merged = self._merge(None if body_ends else body_env, None if else_ends else else_env)
        new = stmt.with_changes(test=test, body=_indented(body, stmt.body), orelse=orelse)
        return [new], merged, body_ends and else_ends

    def small(self, small: cst.BaseSmallStatement,
              env: dict[str, Known]) -> tuple[cst.BaseSmallStatement | None, dict[str, Known], bool]:
        if isinstance(small, (cst.Global, cst.Nonlocal)):
            raise _Bail
        if isinstance(small, cst.Assign):
            value = self.fold(small.value, env)
            for target in small.targets:
                if not isinstance(target.target, cst.Name):
                    self._observe(target.target, env)
            env = self._rebind(env, set().union(*(bound_names(t) for t in small.targets)))
            # Propagate only constants that folding produced: code the recipe
            # does not touch stays as it was written.
            derived = is_constant(value) and not is_constant(small.value)
            if len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name) and derived:
                env[small.targets[0].target.value] = Known(value, False)
            return small.with_changes(value=value), env, False
        if isinstance(small, (cst.AnnAssign, cst.AugAssign)):
            value = self.fold(small.value, env) if small.value is not None else None
            if isinstance(small, cst.AugAssign):
                self._observe(small.target, env)
            return small.with_changes(value=value), self._rebind(env, bound_names(small)), False
        if isinstance(small, cst.Expr):
            return small.with_changes(value=self.fold(small.value, env)), env, False
        if isinstance(small, cst.Return):
            value = self.fold(small.value, env) if small.value is not None else None
            return small.with_changes(value=value), env, True
        if isinstance(small, cst.Raise):
            self._observe(small, env)
            return small, env, True
        if isinstance(small, cst.Assert):
            test = self.fold(small.test, env, condition=True)
            if truth(test) is True:
                return None, env, False
            self._observe(small, env)
            return small.with_changes(test=test), env, False
        if isinstance(small, (cst.Break, cst.Continue)):
            return small, env, True
        self._observe(small, env)
        return small, self._forget(env, bound_names(small)), False


class _Liveness:
    """Which names a function body still needs, by mark-and-sweep over its statements."""

    def __init__(self, pure_methods: frozenset[str]) -> None:
        self.pure_methods = pure_methods
        # The fixpoint asks the same questions of the same (immutable) nodes every
        # round; entries keep their node alive so its id cannot be reused.
        self._reads: dict[int, tuple[cst.CSTNode, set[str]]] = {}
        self._pure: dict[int, tuple[cst.CSTNode, bool]] = {}

    def reads(self, node: cst.CSTNode) -> set[str]:
        if id(node) not in self._reads:
            self._reads[id(node)] = (node, names_read(node))
        return self._reads[id(node)][1]

    def pure(self, node: cst.BaseExpression) -> bool:
        if id(node) not in self._pure:
            self._pure[id(node)] = (node, is_pure(node, self.pure_methods))
        return self._pure[id(node)][1]

    def removable(self, small: cst.BaseSmallStatement) -> set[str] | None:
        """Names an assignment binds when dropping it loses nothing but those bindings."""
        if isinstance(small, cst.Assign) and self.pure(small.value):
            return _name_targets(t.target for t in small.targets)
        if isinstance(small, (cst.AnnAssign, cst.AugAssign)) and isinstance(small.target, cst.Name):
            if small.value is None or self.pure(small.value):
                return {small.target.value}
        return None

    def live(self, statements: Sequence[cst.BaseStatement]) -> set[str]:
        live: set[str] = set()
        while True:
            reads: set[str] = set()
            self._mark(statements, live, reads)
            if reads <= live:
                return live
            live |= reads

    def _mark(self, statements: Sequence[cst.BaseStatement], live: set[str], reads: set[str]) -> bool:
        essential_any = False
        for stmt in statements:
            essential_any |= self._mark_one(stmt, live, reads)
        return essential_any

    def _mark_one(self, stmt: cst.BaseStatement, live: set[str], reads: set[str]) -> bool:
        if isinstance(stmt, cst.SimpleStatementLine):
            essential_any = False
            for small in stmt.body:
                binds = self.removable(small)
                if isinstance(small, cst.Pass) or (binds is not None and not binds & live):
                    continue
                if isinstance(small, cst.Expr) and self.pure(small.value):
                    continue
                essential_any = True
                reads |= self.reads(small)
            return essential_any
        if isinstance(stmt, cst.If):
            inner = self._mark(stmt.body.body, live, reads)
            orelse = stmt.orelse
            if isinstance(orelse, cst.If):
                inner |= self._mark_one(orelse, live, reads)
            elif isinstance(orelse, cst.Else):
                inner |= self._mark(orelse.body.body, live, reads)
            if inner or not self.pure(stmt.test):
                reads |= self.reads(stmt.test)
                return True
            return False
        if isinstance(stmt, (cst.For, cst.While)):
            # Kept whole; its head stays live, its body is marked like any block.
            reads |= self.reads(stmt.iter if isinstance(stmt, cst.For) else stmt.test)
            self._mark(stmt.body.body, live, reads)
            if stmt.orelse is not None:
                self._mark(stmt.orelse.body.body, live, reads)
            return True
        if isinstance(stmt, cst.With):
            for item in stmt.items:
                reads |= self.reads(item.item)
            self._mark(stmt.body.body, live, reads)
            return True
        # try, match, nested defs: kept, and everything they read stays live.
        reads |= self.reads(stmt)
        return True

    def sweep(self, statements: Sequence[cst.BaseStatement], live: set[str],
              candidates: set[str]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for stmt in statements:
            if isinstance(stmt, cst.SimpleStatementLine):
                kept = []
                for small in stmt.body:
                    binds = self.removable(small)
                    if binds and binds <= candidates and not binds & live:
                        continue
                    kept.append(small)
                if kept:
                    kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
                    out.append(stmt.with_changes(body=kept))
            elif isinstance(stmt, cst.If):
                swept = self._sweep_if(stmt, live, candidates)
                if swept is not None:
                    out.append(swept)
            elif isinstance(stmt, (cst.For, cst.While, cst.With)):
                body = self.sweep(stmt.body.body, live, candidates)
                out.append(stmt.with_changes(body=_indented(body, stmt.body)))
            else:
                out.append(stmt)
        return out

    def _sweep_if(self, stmt: cst.If, live: set[str], candidates: set[str]) -> cst.If | None:
        body = self.sweep(stmt.body.body, live, candidates)
        orelse = stmt.orelse
        if isinstance(orelse, cst.If):
            orelse = self._sweep_if(orelse, live, candidates)
        elif isinstance(orelse, cst.Else):
            rest = self.sweep(orelse.body.body, live, candidates)
            orelse = orelse.with_changes(body=_indented(rest, orelse.body)) if rest else None
        if not body and orelse is None and self.pure(stmt.test):
            return None
        return stmt.with_changes(body=_indented(body, stmt.body), orelse=orelse)


class _Fact:
    def __init__(self, expression: str, value: str, reason: str) -> None:
        self.expression = cst.parse_expression(expression)
        self.value = cst.parse_expression(value)
        if not is_constant(self.value):
            raise ValueError(f"specialize_arguments: fact {expression} = {value!r} is not a literal constant")
        self.reason = reason
        self.names = names_read(self.expression)

    def guard(self) -> cst.SimpleStatementLine:
        """``torch._assert(<check>, reason)``, in a form every tracer records.

        ``not x`` would force a Proxy to bool under fx, ``x == False`` is
        unsupported on export's symbolic booleans, and strict export cannot
        trace ``torch.sym_not`` of a plain bool: a false comparison is guarded
        by its inverse, anything else by ``torch.sym_not``.
        """
        subject = self.expression.deep_clone()
        value = literal_value(self.value)
        if value is True:
            check: cst.BaseExpression = subject
        elif value is False and _invertible(subject):
            target = subject.comparisons[0]
            inverse = _INVERSE[type(target.operator)]()
            check = subject.with_changes(comparisons=[target.with_changes(operator=inverse)])
        elif value is False:
            check = cst.Call(cst.parse_expression("torch.sym_not"), [cst.Arg(subject)])
        else:
            if not isinstance(subject, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
                subject = subject.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            check = cst.Comparison(subject, [cst.ComparisonTarget(cst.Equal(), self.value.deep_clone())])
        call = cst.Call(cst.parse_expression("torch._assert"),
                        [cst.Arg(check), cst.Arg(cst.SimpleString(repr(self.reason)))])
        return cst.SimpleStatementLine([cst.Expr(call)])


_INVERSE: dict[type, type] = {cst.LessThan: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThan,
                              cst.GreaterThan: cst.LessThanEqual, cst.LessThanEqual: cst.GreaterThan,
                              cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal}


def _invertible(node: cst.BaseExpression) -> bool:
    return (isinstance(node, cst.Comparison) and len(node.comparisons) == 1
            and type(node.comparisons[0].operator) in _INVERSE)


_ASSERT_CALL = cst.parse_expression("torch._assert")


class _FactRewriter(cst.CSTTransformer):
    """Replace fact expressions by their values, guarding each statement that used one.

    The guard (``torch._assert``, which tracers record) runs just before the
    statement; guards of ``elif`` tests go before the whole ``if``.  A guard
    already emitted at the function's top level, on names never rebound, is not
    repeated.
    """

    def __init__(self, facts: Sequence[_Fact], rebound: set[str]) -> None:
        super().__init__()
        self.facts = facts
        self.rebound = rebound
        self.pending: list[list[_Fact]] = []
        self.elifs: set[int] = set()
        self.dominating: set[int] = set()

    def _opens_statement(self, node: cst.CSTNode) -> bool:
        return isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) and id(node) not in self.elifs

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, cst.Call) and node.func.deep_equals(_ASSERT_CALL):
            return False
        if isinstance(node, cst.If) and isinstance(node.orelse, cst.If):
            self.elifs.add(id(node.orelse))
        if self._opens_statement(node):
            self.pending.append([])
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[override]
        if isinstance(original_node, cst.BaseExpression):
            for fact in self.facts:
                if original_node.deep_equals(fact.expression):
                    self.pending[-1].append(fact)
                    return fact.value.deep_clone()
        result = super().on_leave(original_node, updated_node)
        if not self._opens_statement(original_node):
            return result
        depth = len(self.pending)
        guards = []
        for fact in dict.fromkeys(self.pending.pop()):
            key = self.facts.index(fact)
            if key in self.dominating:
                continue
            guards.append(fact.guard())
            if depth == 1 and not fact.names & self.rebound:
                self.dominating.add(key)
        if not guards:
            return result
        guards[0] = guards[0].with_changes(leading_lines=result.leading_lines)
        return cst.FlattenSentinel([*guards, result.with_changes(leading_lines=())])


class SpecializeArguments(Transform):
    """Fix optional arguments to constants, fold what they guard, and drop them.

    The recipe states model-wide facts such as "head masks are never used"
    (``head_mask = None``) or "no cache" (``use_cache = False``).  Every function
    taking such a parameter loses it; inside, the constant is propagated
    flow-sensitively (a reassignment ends it; if the entry value could still be
    read, the name is bound to the constant at entry instead), ``is None``,
    ``not``, ``and``/``or``, ternaries and ``if`` tests on it are folded, dead
    branches and statements after a folded ``return`` disappear, assignments that
    only fed removed code are dropped, and calls stop passing the parameter as a
    keyword (calls into imported code are left alone)::

        def forward(self, x, head_mask=None, return_dict=None):     # before
            return_dict = return_dict if return_dict is not None else self.config.use_return_dict
            if head_mask is not None:
                x = x * head_mask
            if not return_dict:
                return (x,)
            return Output(x)

        def forward(self, x):                                        # after
            return_dict = False
            return (x,)

    ``pure_methods`` names methods whose calls may be dropped when their
    result is unused (e.g. ``get_head_mask``).
    """

    DESCRIPTION = "fix recipe arguments to constants, fold and drop what they guard"

    def __init__(self, context: cst.codemod.CodemodContext, constants: dict[str, str],
                 pure_methods: Sequence[str] = (), facts: Sequence[dict[str, str]] = ()) -> None:
        super().__init__(context)
        self.constants: dict[str, cst.BaseExpression] = {}
        for name, text in constants.items():
            value = cst.parse_expression(text)
            if not is_constant(value):
                raise ValueError(f"specialize_arguments: {name} = {text!r} is not a literal constant")
            self.constants[name] = value
        self.pure_methods = frozenset(pure_methods)
        self.facts = [_Fact(f["expression"], f["value"], f.get("reason", f"assumed {f['expression']} == "
                                                                         f"{f['value']}")) for f in facts]
        self._dropped_keywords: list[int] = []

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return bool(self._dropped_keywords)  # module-level statements hold no functions

    def visit_Module(self, node: cst.Module) -> None:
        # Only "is the callee an imported name?" matters here, and the module's
        # top-level import bindings answer it; full scope analysis would cost
        # more than the rest of this transform.
        self._imported = set(module_imports(node)) | set(dir(builtins))

    def _calls_into_imports(self, func: cst.BaseExpression) -> bool:
        root = func
        while isinstance(root, (cst.Attribute, cst.Call, cst.Subscript)):
            root = root.value if not isinstance(root, cst.Call) else root.func
        return isinstance(root, cst.Name) and root.value in self._imported

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        keep = [not (arg.keyword is not None and arg.keyword.value in self.constants) for arg in updated_node.args]
        if all(keep) or self._calls_into_imports(original_node.func):
            return updated_node
        if self._dropped_keywords:
            self._dropped_keywords[-1] += 1
        return updated_node.with_changes(args=_drop_items(updated_node.args, keep))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._dropped_keywords.append(0)

    def leave_FunctionDef(self, original_node: cst.FunctionDef,
                          updated_node: cst.FunctionDef) -> cst.FunctionDef:
        params = updated_node.params
        every = [*params.posonly_params, *params.params, *params.kwonly_params]
        # Only optional parameters: a caller may pass a required one positionally.
        specialized = [p.name.value for p in every if p.name.value in self.constants and p.default is not None]
        dropped = self._dropped_keywords.pop()
        if self._dropped_keywords:
            self._dropped_keywords[-1] += dropped
        if not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        statements = updated_node.body.body
        reads = names_read(updated_node.body) if self.facts else set()
        facts = [fact for fact in self.facts if fact.names <= reads]
        if facts:
            rewriter = _FactRewriter(facts, bound_names(updated_node.body))
            rewritten = updated_node.body.visit(rewriter)
            facts = facts if not rewritten.deep_equals(updated_node.body) else []
            statements = rewritten.body
        if not specialized and not dropped and not facts:
            return updated_node
        env = {name: Known(self.constants[name], True) for name in specialized}
        folder = _FunctionFolder(self.pure_methods)
        try:
            body, _, _ = folder.block(statements, env)
        except _Bail:
            self.warn(f"{updated_node.name.value}: global/nonlocal declarations, left unspecialized")
            return updated_node
        liveness = _Liveness(self.pure_methods)
        originally_live = liveness.live(original_node.body.body)
        while True:
            live = liveness.live(body)
            swept = liveness.sweep(body, live, originally_live - live)
            if len(swept) == len(body) and all(a.deep_equals(b) for a, b in zip(swept, body)):
                break
            body = swept
        entry = [cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], self.constants[name])])
                 for name in specialized if name in folder.observed]
        if entry:
            docstring = 1 if body and _is_docstring(body[0]) else 0
            body = [*body[:docstring], *entry, *body[docstring:]]
        new_params = params.with_changes(
            posonly_params=self._without(params.posonly_params),
            params=self._without(params.params),
            kwonly_params=self._without(params.kwonly_params),
        )
        return updated_node.with_changes(params=new_params, body=_indented(body, updated_node.body))

    def _without(self, params: Sequence[cst.Param]) -> list[cst.Param]:
        return _drop_items(params, [p.name.value not in self.constants or p.default is None for p in params])


def _is_docstring(stmt: cst.BaseStatement) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, cst.SimpleString))
