"""Liveness: which names a function body still needs, and the assignments it can lose."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst

from transforms.analysis.names import name_targets, names_read
from transforms.analysis.purity import is_pure
from transforms.analysis.syntax import indented, without_semicolon_at_end


class Liveness:
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
            return name_targets(t.target for t in small.targets)
        if isinstance(small, (cst.AnnAssign, cst.AugAssign)) and isinstance(small.target, cst.Name):
            if small.value is None or self.pure(small.value):
                return {small.target.value}
        return None

    def remove_dead(self, statements: Sequence[cst.BaseStatement], candidates: set[str]) -> list[cst.BaseStatement]:
        """``statements`` without the removable assignments to ``candidates`` that nothing reads.

        Removing one assignment may make the values it read dead too: sweep until nothing changes.
        """
        body = list(statements)
        while True:
            live = self.live(body)
            swept = self.sweep(body, live, candidates - live)
            if len(swept) == len(body) and all(a.deep_equals(b) for a, b in zip(swept, body)):
                return body
            body = swept

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
                    if isinstance(small, cst.Pass) or (binds and binds <= candidates and not binds & live):
                        continue  # a block left with nothing gets its pass back from indented()
                    kept.append(small)
                if kept:
                    out.append(without_semicolon_at_end(stmt, kept))
            elif isinstance(stmt, cst.If):
                swept = self._sweep_if(stmt, live, candidates)
                if swept is not None:
                    out.append(swept)
            elif isinstance(stmt, (cst.For, cst.While, cst.With)):
                body = self.sweep(stmt.body.body, live, candidates)
                out.append(stmt.with_changes(body=indented(body, stmt.body)))
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
            orelse = orelse.with_changes(body=indented(rest, orelse.body)) if rest else None
        if not body and orelse is None and self.pure(stmt.test):
            return None
        return stmt.with_changes(body=indented(body, stmt.body), orelse=orelse)
