"""Copy inherited methods from a support file of the same release into a class."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from transforms.analysis.names import bound_names, names_read
from transforms.library.base import Transform, TransformError
from transforms.library.support import BUILTINS as _BUILTINS
from transforms.library.support import Support, free_names


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
    imports them (names the support file defines itself are imported from it)::

        class T5PreTrainedModel(PreTrainedModel):            # before
            ...

        class T5PreTrainedModel(PreTrainedModel):            # after
            ...
            # Copied from transformers/modeling_utils.py ModuleUtilsMixin.get_extended_attention_mask
            def get_extended_attention_mask(self, attention_mask: Tensor, ...) -> Tensor:
                ...

    Two things only make sense inside the source class, and are adapted: a call
    of another copied member through the source class
    (``ModuleUtilsMixin.create_extended_attention_mask_for_decoder(...)``) calls
    the copy (``T5PreTrainedModel.create_extended_attention_mask_for_decoder(...)``),
    and a parameter or return annotation naming something only the source class
    defines (``device: device``, the mixin's own ``device`` property) is dropped:
    annotations do nothing at run time.

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
        self.support_globals = _top_level_names(self.support.tree)
        holder = self.support.definition(from_class)
        found = {} if not isinstance(holder, cst.ClassDef) else {
            f.name.value: f for f in holder.body.body if isinstance(f, cst.FunctionDef)}
        missing = [name for name in self.methods if name not in found]
        if missing:
            raise TransformError(f"{self.source} has no {from_class}.{', '.join(missing)}")
        self.copies = {name: self._adapted(found[name]) for name in self.methods}

    def _resolves(self, name: str) -> bool:
        return name in _BUILTINS or self.support.binding(name) is not None or name in self.support_globals

    def _adapted(self, method: cst.FunctionDef) -> cst.FunctionDef:
        """``method`` calling the copies of its siblings, without annotations that would not resolve here."""
        redirected = method.visit(_Redirect(self.from_class, self.into, set(self.methods)))
        assert isinstance(redirected, cst.FunctionDef)
        method = redirected

        def kept(annotation: cst.Annotation | None) -> cst.Annotation | None:
            if annotation is None or all(self._resolves(n) for n in names_read(annotation)):
                return annotation
            return None

        params = method.params
        strip = {"posonly_params", "params", "kwonly_params"}
        changes: dict[str, object] = {field: [p.with_changes(annotation=kept(p.annotation))
                                              for p in getattr(params, field)] for field in strip}
        for field in ("star_arg", "star_kwarg"):
            value = getattr(params, field)
            if isinstance(value, cst.Param):
                changes[field] = value.with_changes(annotation=kept(value.annotation))
        returns = kept(method.returns)
        return method.with_changes(params=params.with_changes(**changes), returns=returns)

    def _schedule_imports(self, method: cst.FunctionDef) -> None:
        taken = set(self.index.root.bindings)
        module = self.support.module_name
        for name in sorted(free_names(method) - _BUILTINS - {self.into}):
            if self.support.binding(name) is not None:
                self.support.add_import(self.context, name)
            elif name in self.support_globals:
                if name in taken and self.index.qualified_names_in(self.index.root, name) != {f"{module}.{name}"}:
                    raise TransformError(f"{self.from_class}.{method.name.value} uses {name}, which {self.source} "
                                         f"defines and this module binds to something else")
                AddImportsVisitor.add_needed_import(self.context, module, name)
            else:
                raise TransformError(f"{self.from_class}.{method.name.value} uses {name}, which {self.source} "
                                     f"neither defines nor imports; cannot copy it")

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


class _Redirect(cst.CSTTransformer):
    """``From.member(...)`` -> ``Into.member(...)`` for the members copied into ``Into``."""

    def __init__(self, source: str, target: str, members: set[str]) -> None:
        self.source, self.target, self.members = source, target, members

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        if m.matches(updated_node, m.Attribute(value=m.Name(self.source))) and updated_node.attr.value in self.members:
            return updated_node.with_changes(value=cst.Name(self.target))
        return updated_node


def _top_level_names(module: cst.Module) -> set[str]:
    """Names a module binds at its top level by a def, a class or an assignment (not by an import)."""
    names: set[str] = set()
    for statement in module.body:
        if isinstance(statement, (cst.ClassDef, cst.FunctionDef)):
            names.add(statement.name.value)
        elif isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, (cst.Assign, cst.AnnAssign)):
                    names |= bound_names(small)
    return names
