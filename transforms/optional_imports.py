"""A top-level ``try`` that imports an optional package -> the code that runs without it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst

from transforms.analysis.syntax import dotted_name
from transforms.library.base import Transform

_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError"})


@dataclass(frozen=True)
class OptionalImportsOptions:
    modules: tuple[str, ...]  # top-level packages the generated code must not depend on (e.g. "apex")


def _imported_roots(statement: cst.CSTNode) -> set[str]:
    if not isinstance(statement, cst.SimpleStatementLine):
        return set()
    roots = set()
    for small in statement.body:
        if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
            roots.add((dotted_name(small.module) or "").split(".")[0])
        elif isinstance(small, cst.Import):
            roots |= {(dotted_name(alias.name) or "").split(".")[0] for alias in small.names}
    return roots


def _catches_import_error(handler: cst.ExceptHandler) -> bool:
    kind = handler.type
    names = [e.value for e in kind.elements] if isinstance(kind, cst.Tuple) else [kind]
    return any(isinstance(name, cst.Name) and name.value in _IMPORT_ERRORS for name in names)


class OptionalImports(Transform):
    """Replace ``try: <import of an optional package> ... except ImportError: <fallback>`` by the fallback.

    A module that swaps in an optional package when it happens to be installed
    (transformers' T5 uses apex's ``FusedRMSNorm`` for ``T5LayerNorm`` when apex
    imports) computes something else, untraceably, on a machine that has it.
    The generated code takes the path of a machine without it: the ``try``
    becomes the body of its handler for ``ImportError`` (nothing when that is
    ``pass``).  ``modules`` names the optional packages::

        try:                                                  # before
            from apex.normalization import FusedRMSNorm
            T5LayerNorm = FusedRMSNorm  # noqa
        except ImportError:
            pass
        except Exception:
            logger.warning("discovered apex but it failed to load")

                                                              # after: nothing
    """

    DESCRIPTION = "try: import <optional package> ... except ImportError: fallback -> fallback"
    Options = OptionalImportsOptions

    def focus(self) -> Iterable[cst.CSTNode]:
        optional = set(self.options.modules)
        self._targets_found = [statement for statement in self.module.body
                if isinstance(statement, cst.Try) and statement.orelse is None and statement.finalbody is None
                and any(_imported_roots(s) & optional for s in statement.body.body)
                and any(_catches_import_error(h) for h in statement.handlers)]
        return self._targets_found

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        targets = {id(node) for node in self._targets_found}
        body: list[cst.BaseStatement] = []
        for original, updated in zip(original_node.body, updated_node.body):
            if id(original) not in targets:
                body.append(updated)
                continue
            assert isinstance(original, cst.Try)
            handler = next(h for h in original.handlers if _catches_import_error(h))
            suite = handler.body
            if isinstance(suite, cst.IndentedBlock):
                statements = list(suite.body)
            else:
                assert isinstance(suite, cst.SimpleStatementSuite)
                statements = [cst.SimpleStatementLine(body=list(suite.body))]
            fallback = [s for s in statements if not (isinstance(s, cst.SimpleStatementLine)
                                                      and all(isinstance(x, cst.Pass) for x in s.body))]
            if fallback:
                fallback[0] = fallback[0].with_changes(leading_lines=original.leading_lines)
            body += fallback
        return updated_node.with_changes(body=body)
