"""Replace base classes, named by qualified name, by others."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from common.schema import OptionError
from transforms.library.base import Transform


@dataclass(frozen=True)
class ReplaceBasesOptions:
    bases: dict[str, str]  # qualified name of a base class -> qualified name of the class replacing it

    def __post_init__(self) -> None:
        for old, new in self.bases.items():
            if "." not in new:
                raise OptionError(f"bases.{old}", f"{new!r} is not a qualified name (module.Class)")


class ReplaceBases(Transform):
    """Derive from another base class where the recipe says so.

    A library base class can put code between a tracer and ``forward``:
    transformers' ``GradientCheckpointingLayer`` (4.53 on) overrides
    ``__call__`` to reroute the call through activation checkpointing when that
    is enabled.  With checkpointing specialized off, ``nn.Module`` does the
    same, and a tracer that wraps submodules (FTPipe's) meets ``forward``
    directly.  The replacement is spelled through the module's own imports
    (``nn.Module`` where ``nn`` is ``torch.nn``), or imported::

        class T5Block(GradientCheckpointingLayer):      # before
        class T5Block(nn.Module):                       # after
    """

    DESCRIPTION = "replace recipe-named base classes"
    Options = ReplaceBasesOptions

    def focus(self) -> Iterable[cst.CSTNode]:
        self._bases = {id(arg): self.options.bases[name]
                       for node in self.index.nodes(cst.ClassDef) for arg in node.bases if arg.keyword is None
                       for name in sorted(self.qualified_names(arg.value)) if name in self.options.bases}
        return [node for node in self.index.nodes(cst.ClassDef) if any(id(a) in self._bases for a in node.bases)]

    def _spelling(self, qualified: str) -> cst.BaseExpression:
        root = self.index.root
        for name in sorted(root.imports):
            target = self.index.qualified_names_in(root, name)
            for full in target:
                if qualified == full or qualified.startswith(full + "."):
                    return cst.parse_expression(name + qualified[len(full):])
        module, _, obj = qualified.rpartition(".")
        AddImportsVisitor.add_needed_import(self.context, module, obj)
        return cst.Name(obj)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        replacement = self._bases.get(id(original_node))
        return updated_node if replacement is None else updated_node.with_changes(value=self._spelling(replacement))
