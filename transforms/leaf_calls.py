"""Calls a tracer cannot follow -> calls of the same function through an fx leaf helper."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from transforms.base import Transform
from transforms.leaf_helper import with_fx_wrap
from transforms.options import OptionError


@dataclass(frozen=True)
class LeafCallsOptions:
    calls: dict[str, str]  # qualified name of a function -> "module.helper" that calls it as an fx leaf

    def __post_init__(self) -> None:
        for name, helper in self.calls.items():
            module, _, function = helper.rpartition(".")
            if not module or not function.isidentifier():
                raise OptionError(f"calls.{name}", f"{helper!r} is not a module.function")


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
    """

    DESCRIPTION = "calls of recipe-named functions -> the same calls through fx leaf helpers"
    Options = LeafCallsOptions

    def focus(self) -> Iterable[cst.CSTNode]:
        self._used: set[str] = set()
        return [call for call in self.index.nodes(cst.Call) if self._helper(call) is not None]

    def _helper(self, call: cst.Call) -> str | None:
        names = self.qualified_names(call)
        found = [self.options.calls[name] for name in sorted(names) if name in self.options.calls]
        return found[0] if len(found) == 1 and len(names) == 1 else None

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        helper = self._helper(original_node)
        if helper is None:
            return updated_node
        module, _, name = helper.rpartition(".")
        AddImportsVisitor.add_needed_import(self.context, module, name)
        self._used.add(name)
        return updated_node.with_changes(func=cst.Name(name))

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        for name in sorted(self._used):
            updated_node = with_fx_wrap(self, original_node, updated_node, name)
        return updated_node
