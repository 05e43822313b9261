"""Copy inherited methods from a support file of the same release into a class."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext

from transforms.base import Transform, TransformError
from transforms.support import Support


@dataclass(frozen=True)
class OverrideOptions:
    source: str  # the support file (a recipe `support` member) holding the class
    from_class: str
    into: str
    methods: tuple[str, ...]


class OverrideInherited(Transform):
    """Give a class its own copy of methods it inherits from another file of the release.

    Some tracer blockers live in base classes outside the modeling file (HF's
    ``ModuleUtilsMixin.get_extended_attention_mask`` branches on
    ``attention_mask.dim()``).  Later transforms can only fix code that is in the
    generated file, so the methods are copied verbatim from the same release's
    source (a recipe support file, never hand-written text) into the class that
    uses them, and the names they need are imported the way the support file
    imports them::

        class T5PreTrainedModel(PreTrainedModel):            # before
            ...

        class T5PreTrainedModel(PreTrainedModel):            # after
            ...
            # Copied from transformers/modeling_utils.py ModuleUtilsMixin.get_extended_attention_mask
            def get_extended_attention_mask(self, attention_mask: Tensor, ...) -> Tensor:
                ...

    A class that already defines a method keeps its own, so rerunning is a no-op.
    """

    DESCRIPTION = "copy inherited methods from the release's support files into a class"
    Options = OverrideOptions

    def __init__(self, context: CodemodContext, options: OverrideOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.support = Support(context, self.options.source)
        self.source = self.options.source
        self.into = self.options.into
        self.from_class = from_class = self.options.from_class
        self.methods = list(self.options.methods)
        holder = self.support.definition(from_class)
        found = {} if not isinstance(holder, cst.ClassDef) else {
            f.name.value: f for f in holder.body.body if isinstance(f, cst.FunctionDef)}
        missing = [name for name in self.methods if name not in found]
        if missing:
            raise TransformError(f"{self.source} has no {from_class}.{', '.join(missing)}")
        self.copies = {name: found[name] for name in self.methods}

    def _schedule_imports(self, method: cst.FunctionDef) -> None:
        for name in self.support.needs(method, f"{self.from_class}.{method.name.value}"):
            self.support.add_import(self.context, name)

    def focus(self) -> Iterable[cst.CSTNode]:
        return [s for s in self.module.body if isinstance(s, cst.ClassDef) and s.name.value == self.into]

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False  # methods are added whole; nothing inside any class is rewritten

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if updated_node.name.value != self.into:
            return updated_node
        existing = {f.name.value for f in updated_node.body.body if isinstance(f, cst.FunctionDef)}
        added = []
        for name, method in self.copies.items():
            if name in existing:
                continue
            self._schedule_imports(method)
            note = cst.EmptyLine(comment=cst.Comment(f"# Copied from {self.source} {self.from_class}.{name}"))
            added.append(method.with_changes(leading_lines=[cst.EmptyLine(indent=False), note]))
        if not added:
            return updated_node
        return updated_node.with_changes(body=updated_node.body.with_changes(
            body=[*updated_node.body.body, *added]))
