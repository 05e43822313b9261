"""``torch.finfo(x.dtype).min`` -> a call to the fx leaf ``finfo_value``."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst

from transforms.library.leaf_helper import LeafHelperRewrite


class FinfoValues(LeafHelperRewrite):
    """Read ``torch.finfo(<dtype>).<attr>`` through ``finfo_value(<dtype>, "<attr>")``.

    HF builds attention masks with the smallest value of the activations' dtype,
    ``torch.finfo(inputs_embeds.dtype).min``, often in a helper that receives the
    dtype (BART's ``_expand_mask(mask, dtype)``).  ``symbolic_trace`` turns the
    ``dtype`` attribute of a traced tensor into a Proxy, which ``torch.finfo``
    refuses; the helper (``stateless.finfo_value``) is registered with
    ``torch.fx.wrap`` and recorded as one call evaluated when the graph runs,
    torch.export sees through it, and FTPipe's tracer gets the value from dtype
    comparisons it can evaluate.  A dtype named as a constant (``torch.float16``)
    is left alone: every tracer evaluates that.  Option ``module`` is where the
    generated code imports the helper from::

        return inverted_mask.masked_fill(inverted_mask.bool(), torch.finfo(dtype).min)            # before
        return inverted_mask.masked_fill(inverted_mask.bool(), finfo_value(dtype, "min"))          # after
    """

    DESCRIPTION = "torch.finfo(dtype).attr -> finfo_value(dtype, 'attr'), an fx leaf"
    HELPER = "finfo_value"

    def _dtype(self, node: cst.CSTNode) -> cst.BaseExpression | None:
        """The dtype expression of ``torch.finfo(<dtype>).<attr>``, if ``node`` is one whose dtype may be traced."""
        if not (isinstance(node, cst.Attribute) and isinstance(node.value, cst.Call)):
            return None
        call = node.value
        if "torch.finfo" not in self.qualified_names(call) or len(call.args) != 1:
            return None
        arg = call.args[0]
        if arg.keyword is not None or arg.star:
            return None
        names = self.qualified_names(arg.value)
        if names and all(name.startswith("torch.") for name in names):
            return None  # a dtype constant such as torch.float16
        return arg.value

    def focus(self) -> Iterable[cst.CSTNode]:
        return [node for node in self.index.nodes(cst.Attribute) if self._dtype(node) is not None]

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return True  # the idiom is an expression, found anywhere

    def rewrite(self, node: cst.If) -> cst.Assign | None:
        return None  # no statement is replaced; leave_Attribute does the work

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        dtype = self._dtype(original_node)
        if dtype is None:
            return updated_node
        assert isinstance(updated_node.value, cst.Call)
        self.rewritten = True
        call = self.helper_call(updated_node.value.args[0].value, cst.SimpleString(f'"{updated_node.attr.value}"'))
        return call.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
