"""Copy classes and functions a modeling file imports from another file of the release into it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext

from transforms.analysis.syntax import dotted_name, drop_items
from transforms.library.base import Transform, TransformError
from transforms.library.support import Support


@dataclass(frozen=True)
class CopyDefinitionsOptions:
    source: str  # the support file (a recipe `support` member) defining them
    names: tuple[str, ...]  # top-level classes or functions the module imports from it


class CopyDefinitions(Transform):
    """Replace ``from <support> import Name`` by a verbatim copy of ``Name``'s definition.

    Tracer blockers also live in classes the modeling file imports (GPT-2's
    ``Conv1D`` in ``modeling_utils.py`` ends with ``x.view(*size_out)``); later
    transforms can only fix code that is in the generated file.  The definition
    is copied from the same release's source (never hand-written text), before
    the module's first class or function, under its own name, so the state-dict
    keys and every reference stay as they were; the names it reads are imported
    the way the support file imports them, unless the module already binds them
    to the same objects::

        from transformers.modeling_utils import Conv1D, PreTrainedModel    # before

        from transformers.modeling_utils import PreTrainedModel            # after
        ...
        # Copied from transformers/modeling_utils.py Conv1D
        class Conv1D(nn.Module):
            ...

    A module that defines the name already (this transform's output) is left alone.
    """

    DESCRIPTION = "copy classes and functions imported from the release's support files into the module"
    Options = CopyDefinitionsOptions

    def __init__(self, context: CodemodContext, options: CopyDefinitionsOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.support = Support(context, self.options.source)
        self.copies: dict[str, cst.ClassDef | cst.FunctionDef] = {}
        for name in self.options.names:
            definition = self.support.definition(name)
            if definition is None:
                raise TransformError(f"{self.options.source} defines no class or function {name}")
            self.copies[name] = definition
        self._pending: list[str] = []  # names to copy into this module, in option order

    def _imported_here(self, node: cst.ImportFrom, name: str) -> bool:
        """Whether ``node`` imports ``name`` (unaliased) from the support file."""
        if isinstance(node.names, cst.ImportStar):
            return False
        module = "." * len(node.relative) + (dotted_name(node.module) or "" if node.module else "")
        if self.index.absolute_module(module) != self.support.module_name:
            return False
        return any(alias.evaluated_name == name and alias.asname is None for alias in node.names)

    def focus(self) -> Iterable[cst.CSTNode] | None:
        defined = {s.name.value for s in self.module.body if isinstance(s, (cst.ClassDef, cst.FunctionDef))}
        imports = [small for line in self.module.body if isinstance(line, cst.SimpleStatementLine)
                   for small in line.body if isinstance(small, cst.ImportFrom)]
        self._pending = []
        for name in self.options.names:
            if name in defined:
                continue
            if not any(self._imported_here(node, name) for node in imports):
                raise TransformError(f"the module neither imports {name} from {self.options.source} nor defines it")
            self._check_names(name)
            self._pending.append(name)
        return None if self._pending else []  # the whole module: an import line and the top level

    def _check_names(self, name: str) -> None:
        """Schedule the imports a copy of ``name`` needs; refuse one the module binds to something else."""
        root = self.index.root
        for needed in self.support.needs(self.copies[name], name):
            wanted = self.support.binding(needed)
            if needed in root.bindings and needed not in self.options.names:
                here = self.index.qualified_names_in(root, needed) if needed in root.imports else set()
                if here != {wanted}:
                    raise TransformError(f"{name} uses {needed}, which this module binds to something other "
                                         f"than {self.options.source}'s {wanted}")
                continue
            self.support.add_import(self.context, needed)

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def leave_ImportFrom(self, original_node: cst.ImportFrom,
                         updated_node: cst.ImportFrom) -> cst.ImportFrom | cst.RemovalSentinel:
        moved = [name for name in self._pending if self._imported_here(original_node, name)]
        if not moved or isinstance(updated_node.names, cst.ImportStar):
            return updated_node
        names = list(updated_node.names)
        kept = drop_items(names, [alias.evaluated_name not in moved or alias.asname is not None for alias in names])
        if not kept:
            return cst.RemoveFromParent()
        if len(kept) == 1 and updated_node.lpar is None:
            kept[0] = kept[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(names=kept)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self._pending:
            return updated_node
        body = list(updated_node.body)
        first = next((i for i, s in enumerate(body) if isinstance(s, (cst.ClassDef, cst.FunctionDef))), len(body))
        copies = []
        for name in self._pending:
            note = cst.EmptyLine(comment=cst.Comment(f"# Copied from {self.options.source} {name}"))
            copies.append(self.copies[name].with_changes(
                leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False), note]))
        return updated_node.with_changes(body=[*body[:first], *copies, *body[first:]])
