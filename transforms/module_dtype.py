"""``self.dtype`` in a method -> ``module_dtype(self)``, which a tracer's wrapped parameters do not break."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst
from libcst.codemod.visitors import AddImportsVisitor

from transforms.library.base import Transform


class ModuleDtype(Transform):
    """Read a module's dtype through ``stateless.module_dtype(self)``.

    ``ModuleUtilsMixin.dtype`` walks ``self.parameters()``, a set of them.
    FTPipe's tracer replaces the own parameters of the module whose forward
    runs by wrappers that cannot be hashed: a model holding a parameter itself
    (the shared weight of a stateless GPT-2, BERT or RoBERTa base model) fails
    with ``tracing Parameter::__hash__ is currently not supported``.  The helper
    returns ``self.dtype`` itself wherever the parameters are tensors (eager,
    torch.fx, torch.export: results unchanged) and otherwise the dtype of the
    first own parameter, the one ``dtype`` reads::

        attention_mask = attention_mask.to(dtype=self.dtype)                 # before
        attention_mask = attention_mask.to(dtype=module_dtype(self))         # after
        # with `from stateless import module_dtype`

    Only ``<first parameter>.dtype`` read in a method of a class is rewritten.
    """

    DESCRIPTION = "self.dtype in methods -> stateless.module_dtype(self)"

    def focus(self) -> Iterable[cst.CSTNode]:
        return [node for node in self.index.nodes(cst.Attribute) if self._reads_own_dtype(node)]

    def _reads_own_dtype(self, node: cst.Attribute) -> bool:
        if node.attr.value != "dtype" or not isinstance(node.value, cst.Name):
            return False
        index = self.index
        if isinstance(index.parent(node), (cst.AssignTarget, cst.AugAssign, cst.Del)):
            return False  # a store, not a read
        method = index.scope_of(node).node
        if not (isinstance(method, cst.FunctionDef) and method.params.params
                and isinstance(index.scope_of(method).node, cst.ClassDef)):
            return False
        if any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in method.decorators):
            return False
        owner = method.params.params[0].name.value
        return node.value.value == owner and index.lookup(index.scope_of(node), owner) is index.scope_of(node)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        if not self._reads_own_dtype(original_node):
            return updated_node
        AddImportsVisitor.add_needed_import(self.context, "stateless", "module_dtype")
        return cst.Call(cst.Name("module_dtype"), [cst.Arg(updated_node.value)], lpar=updated_node.lpar,
                        rpar=updated_node.rpar)
