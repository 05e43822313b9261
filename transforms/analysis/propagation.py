"""Flow-sensitive constant propagation over one function body."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from transforms.analysis.folding import ExpressionFolder, Known, simplify_condition
from transforms.analysis.literals import is_constant, truth
from transforms.analysis.names import bound_names, names_read
from transforms.analysis.syntax import indented, without_semicolon_at_end

Env = dict[str, Known]
# The statements a block folds to, the environment after it, and whether it always ends in a jump.
Folded = tuple[list[cst.BaseStatement], Env, bool]


class Unsupported(Exception):
    """The function uses a construct whose scoping the propagator does not model."""


class FunctionFolder:
    """Flow-sensitive constant propagation over one function body.

    The environment maps names to what is known about them at the current
    point.  Branches are merged conservatively, loops invalidate every name
    they bind, and a name whose entry value (the removed parameter) might
    still be read unsubstituted is reported in ``observed`` so the caller can
    bind it at entry: reassignment never makes folding unsound.
    """

    def __init__(self, pure_methods: frozenset[str], classes: frozenset[str] = frozenset(),
                 propagate: frozenset[str] = frozenset()) -> None:
        self.pure_methods = pure_methods
        self.classes = classes  # see ExpressionFolder
        self.propagate = propagate  # names whose literal assignments are propagated too
        self.observed: set[str] = set()

    def fold(self, expr: cst.BaseExpression, env: Env, condition: bool = False) -> cst.BaseExpression:
        folder = ExpressionFolder(env, self.classes)
        result = expr.visit(folder)
        self.observed |= folder.observed
        return simplify_condition(result, self.pure_methods) if condition else result

    def _observe(self, node: cst.CSTNode, env: Env) -> None:
        self.observed |= {name for name in names_read(node) if name in env and env[name].from_entry}

    @staticmethod
    def _merge(*envs: Env | None) -> Env:
        live = [env for env in envs if env is not None]
        merged: Env = {}
        for name in set().union(*live):
            states = [env.get(name, Known(None, False)) for env in live]
            first = states[0].value
            same = first is not None and all(s.value is not None and s.value.deep_equals(first) for s in states)
            merged[name] = Known(first if same else None, any(s.from_entry for s in states))
        return merged

    @staticmethod
    def _forget(env: Env, names: set[str]) -> Env:
        forgotten = dict(env)
        for name in names:
            forgotten[name] = Known(None, env[name].from_entry if name in env else False)
        return forgotten

    @staticmethod
    def _rebind(env: Env, names: set[str]) -> Env:
        """An assignment ends both the constant and the entry value of what it binds."""
        return {**env, **{name: Known(None, False) for name in names}}

    def block(self, statements: Sequence[cst.BaseStatement],
              env: Env) -> Folded:
        out: list[cst.BaseStatement] = []
        for statement in statements:
            new, env, terminated = self.statement(statement, env)
            out.extend(new)
            if terminated:
                return out, env, True
        return out, env, False

    def statement(self, stmt: cst.BaseStatement,
                  env: Env) -> Folded:
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
            return [without_semicolon_at_end(stmt, kept)], env, terminated
        if isinstance(stmt, cst.If):
            return self.if_statement(stmt, env)
        if isinstance(stmt, (cst.For, cst.While)):
            return self.loop(stmt, env)
        if isinstance(stmt, cst.With):
            items = [item.with_changes(item=self.fold(item.item, env)) for item in stmt.items]
            env = self._forget(env, set().union(*(bound_names(item) for item in stmt.items)))
            body, env, terminated = self.block(stmt.body.body, env)
            return [stmt.with_changes(items=items, body=indented(body, stmt.body))], env, terminated
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            # Nested scopes run later and see the final bindings: substitute nothing inside.
            self._observe(stmt, env)
            return [stmt], self._forget(env, {stmt.name.value}), False
        # try/match and anything else: keep as is, forget what it binds.
        self._observe(stmt, env)
        return [stmt], self._forget(env, bound_names(stmt)), False

    def loop(self, stmt: cst.For | cst.While,
             env: Env) -> Folded:
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
            changes = dict(head, body=indented(body, stmt.body))
            if stmt.orelse is not None:
                orelse, _, _ = self.block(stmt.orelse.body.body, dict(loop_env))
                changes["orelse"] = stmt.orelse.with_changes(body=indented(orelse, stmt.orelse.body))
            folded = stmt.with_changes(**changes)
            rebinds = bound_names(folded)
            if rebinds >= forget:
                return [folded], loop_env, False
            forget = rebinds

    def if_statement(self, stmt: cst.If,
                     env: Env) -> Folded:
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
                orelse = stmt.orelse.with_changes(body=indented(branch, stmt.orelse.body))
        merged = self._merge(None if body_ends else body_env, None if else_ends else else_env)
        new = stmt.with_changes(test=test, body=indented(body, stmt.body), orelse=orelse)
        return [new], merged, body_ends and else_ends

    def small(self, small: cst.BaseSmallStatement,
              env: Env) -> tuple[cst.BaseSmallStatement | None, Env, bool]:
        if isinstance(small, (cst.Global, cst.Nonlocal)):
            raise Unsupported
        if isinstance(small, cst.Assign):
            value = self.fold(small.value, env)
            for target in small.targets:
                if not isinstance(target.target, cst.Name):
                    self._observe(target.target, env)
            single = small.targets[0].target if len(small.targets) == 1 else None
            before = env.get(single.value) if isinstance(single, cst.Name) else None
            env = self._rebind(env, set().union(*(bound_names(t) for t in small.targets)))
            # Propagate only constants that folding produced, or that rebind a name to the
            # constant it already holds: code the recipe does not touch stays as it was written.
            derived = is_constant(value) and (not is_constant(small.value) or (
                before is not None and before.value is not None and before.value.deep_equals(value)))
            if isinstance(single, cst.Name) and (derived or (is_constant(value) and single.value in self.propagate)):
                env[single.value] = Known(value, False)
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
