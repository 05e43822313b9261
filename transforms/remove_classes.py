"""Remove the classes of a modeling file that a recipe does not convert."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext

from transforms.analysis.names import names_read
from transforms.library.base import Transform, TransformError


@dataclass(frozen=True)
class RemoveClassesOptions:
    classes: tuple[str, ...]  # top-level classes to remove


class RemoveClasses(Transform):
    """Drop top-level classes the recipe leaves unconverted, and the imports only they used.

    The rewrites are module-wide: specializing an argument away or giving a
    base model one output changes every caller, including heads the recipe
    does not convert (GPT-2's double-heads and sequence-classification models
    read ``transformer_outputs[0]`` of a base model that now returns its last
    hidden state, not a tuple).  Rather than leave such a class in the
    generated file, computing something else without a word, the recipe
    removes it; code that still names a removed class is an error::

        class GPT2LMHeadModel(GPT2PreTrainedModel): ...        # before
        class GPT2DoubleHeadsModel(GPT2PreTrainedModel): ...

        class GPT2LMHeadModel(GPT2PreTrainedModel): ...        # after (classes = ["GPT2DoubleHeadsModel"])
    """

    DESCRIPTION = "remove the classes the recipe does not convert"
    Options = RemoveClassesOptions

    def __init__(self, context: CodemodContext, options: RemoveClassesOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.classes = frozenset(self.options.classes)

    def focus(self) -> Iterable[cst.CSTNode] | None:
        removed = [s for s in self.module.body if isinstance(s, cst.ClassDef) and s.name.value in self.classes]
        if not removed:
            return []
        kept = [s for s in self.module.body if not (isinstance(s, cst.ClassDef) and s.name.value in self.classes)]
        for statement in kept:
            used = names_read(statement) & self.classes
            if used:
                name = getattr(statement, "name", None)
                where = f"{name.value}" if isinstance(name, cst.Name) else "the module"
                raise TransformError(f"{where} uses {sorted(used)[0]}, which the recipe removes")
        for statement in removed:
            for name in sorted(names_read(statement) & self.index.root.imports.keys()):
                self.remove_unused_import_of(name)
        return None

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def leave_ClassDef(self, original_node: cst.ClassDef,
                       updated_node: cst.ClassDef) -> cst.ClassDef | cst.RemovalSentinel:
        return cst.RemoveFromParent() if original_node.name.value in self.classes else updated_node
