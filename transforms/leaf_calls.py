"""Calls a tracer cannot follow -> calls of the same function through an fx leaf helper, or of a traceable one."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from common.schema import OptionError
from transforms.library.base import Transform
from transforms.library.leaf_helper import with_fx_wrap


@dataclass(frozen=True)
class LeafCallsOptions:
    calls: dict[str, str]  # qualified name of a function -> "module.helper" that calls it as an fx leaf
    # Functions of ``calls`` whose helper is a traceable replacement, not a leaf: it takes arguments an
    # fx graph cannot hold (a config object), so tracers run it and it registers its own leaves.
    traced: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, helper in self.calls.items():
            module, _, function = helper.rpartition(".")
            if not module or not function.isidentifier():
                raise OptionError(f"calls.{name}", f"{helper!r} is not a module.function")
        for name in self.traced:
            if name not in self.calls:
                raise OptionError("traced", f"{name!r} is not one of calls")


class LeafCalls(Transform):
    """Call a function through a helper that ``torch.fx`` records as one node instead of running it.

    Under ``symbolic_trace`` some functions cannot take a Proxy: ``torch.finfo``
    of a traced tensor's dtype raises ``TypeError``.  The recipe maps such a
    function to a helper that calls it (``stateless.finfo``); the generated
    module imports the helper and registers it with ``torch.fx.wrap``, so fx
    records a call (evaluated when the graph runs) wherever an argument is a
    Proxy and calls it at once otherwise.  Eager mode and torch.export run the
    original function::

        mask = (1.0 - mask) * torch.finfo(embeds.dtype).min       # before
        mask = (1.0 - mask) * finfo(embeds.dtype).min             # after
        # with `from stateless import finfo` and `torch.fx.wrap("finfo")`

    A function named in ``traced`` is replaced by a helper that computes the
    same value in traceable code (``masking_utils.create_causal_mask`` ->
    ``stateless.masks.create_causal_mask``, same parameters): it is imported
    and called, not wrapped, since an fx node cannot hold its config argument::

        mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=m)                  # before
        mask = stateless.masks.create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=m)  # after
        # with `import stateless.masks`; transformers' import goes once nothing else reads it

    A ``traced`` function referred to without a call (Mistral picks its mask
    function: ``f = create_causal_mask if w is None else create_sliding_window_causal_mask``)
    is replaced by its helper there too.
    """

    DESCRIPTION = "calls of recipe-named functions -> the same calls through fx leaf helpers (or traceable ones)"
    Options = LeafCallsOptions

    def focus(self) -> Iterable[cst.CSTNode]:
        self._used: set[str] = set()
        calls = [call for call in self.index.nodes(cst.Call) if self._target(call) is not None]
        self._references = {id(name): name for name in self.index.nodes(cst.Name) if self._reference(name)}
        return [*calls, *self._references.values()]

    def _reference(self, name: cst.Name) -> bool:
        """``name`` refers to a ``traced`` function other than as the callee of a call or in an import."""
        parent = self.index.parent(name)
        if isinstance(parent, (cst.ImportAlias, cst.Attribute)) or (isinstance(parent, cst.Call) and parent.func is name):
            return False
        names = self.qualified_names(name)
        return len(names) == 1 and next(iter(names)) in self.options.traced

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        if id(original_node) not in getattr(self, "_references", {}):
            return updated_node
        target = next(iter(self.qualified_names(original_node)))
        AddImportsVisitor.add_needed_import(self.context, self.options.calls[target].rpartition(".")[0])
        self.remove_unused_import_of(original_node.value)
        return cst.parse_expression(self.options.calls[target])

    def _target(self, call: cst.Call) -> str | None:
        """The qualified name of the mapped function ``call`` calls, if it calls exactly one."""
        names = self.qualified_names(call)
        found = [name for name in sorted(names) if name in self.options.calls]
        return found[0] if len(found) == 1 and len(names) == 1 else None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        target = self._target(original_node)
        if target is None:
            return updated_node
        module, _, name = self.options.calls[target].rpartition(".")
        if target in self.options.traced:
            # Called through its module: the name may be the replaced function's, whose import goes.
            AddImportsVisitor.add_needed_import(self.context, module)
            if isinstance(original_node.func, cst.Name):
                self.remove_unused_import_of(original_node.func.value)
            return updated_node.with_changes(func=cst.parse_expression(self.options.calls[target]))
        AddImportsVisitor.add_needed_import(self.context, module, name)
        self._used.add(name)
        return updated_node.with_changes(func=cst.Name(name))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        for name in sorted(self._used):
            updated_node = with_fx_wrap(self, original_node, updated_node, name)
        return updated_node
