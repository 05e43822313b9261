"""``float(x.size(-1))`` -> ``torch.sym_float(x.size(-1))``: Python numbers from tensor sizes that tracers follow."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from transforms.analysis.syntax import children
from transforms.library.base import Transform

_SYMBOLIC = {"builtins.float": "sym_float", "builtins.int": "sym_int"}


@dataclass(frozen=True)
class SymNumbersOptions:
    size_methods: tuple[str, ...] = ("size", "dim", "numel")  # tensor methods whose result is a size
    size_attributes: tuple[str, ...] = ("shape", "ndim")  # tensor attributes that are sizes


class SymNumbers(Transform):
    """Convert sizes to Python numbers with ``torch.sym_float``/``torch.sym_int``.

    Under torch.fx a size is a Proxy, and ``float(proxy)`` fails (``float()
    argument must be ... not 'Proxy'``); ``torch.sym_float`` is recorded as a
    call instead and computes ``float()`` of the real size when the graph runs
    (torch.export turns it into a symbolic float).  On anything that is not a
    symbolic value it *is* ``float()`` (likewise ``sym_int`` and ``int()``), so
    eager results are unchanged.  Only calls whose argument reads a size
    (options ``size_methods``, ``size_attributes``) are rewritten, and only the
    builtins (matched by qualified name)::

        w = w / (float(v.size(-1)) ** 0.5)              # before (GPT-2's attention)
        w = w / (torch.sym_float(v.size(-1)) ** 0.5)    # after
    """

    DESCRIPTION = "float()/int() of a tensor size -> torch.sym_float/torch.sym_int"
    Options = SymNumbersOptions

    def __init__(self, context: CodemodContext, options: SymNumbersOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.size_methods = frozenset(self.options.size_methods)
        self.size_attributes = frozenset(self.options.size_attributes)

    def _reads_size(self, node: cst.CSTNode) -> bool:
        pending = [node]
        while pending:
            current = pending.pop()
            if isinstance(current, cst.Call) and isinstance(current.func, cst.Attribute) \
                    and current.func.attr.value in self.size_methods:
                return True
            if isinstance(current, cst.Attribute) and current.attr.value in self.size_attributes:
                return True
            pending.extend(children(current))
        return False

    def _target(self, call: cst.Call) -> str | None:
        """The torch function replacing ``call``, or None when it is not a conversion of a size."""
        if not isinstance(call.func, cst.Name) or len(call.args) != 1 or call.args[0].keyword or call.args[0].star:
            return None
        names = self.qualified_names(call) & _SYMBOLIC.keys()
        if len(names) != 1 or not self._reads_size(call.args[0].value):
            return None
        return _SYMBOLIC[names.pop()]

    def focus(self) -> Iterable[cst.CSTNode]:
        return [call for call in self.index.nodes(cst.Call) if self._target(call) is not None]

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        target = self._target(original_node)
        if target is None:
            return updated_node
        AddImportsVisitor.add_needed_import(self.context, "torch")
        return updated_node.with_changes(func=cst.Attribute(cst.Name("torch"), cst.Name(target)))
