"""T5LayerNorm's branch on its weight's dtype -> a call to the fx leaf ``cast_to_half_weight``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from transforms.leaf_helper import FLOAT16, LeafHelperRewrite, block


def _tests_dtype(test: cst.BaseExpression) -> bool:
    """``<x>.dtype == ...``."""
    return isinstance(test, cst.Comparison) and isinstance(test.left, cst.Attribute) \
        and test.left.attr.value == "dtype"


class HalfWeightCast(LeafHelperRewrite):
    """Replace a cast to float16 guarded by a parameter's dtype with ``cast_to_half_weight``.

    ``symbolic_trace`` turns parameters into proxies whose dtype it cannot compare,
    so the branch blocks tracing; the helper keeps the branch but runs as an fx
    leaf.  Option ``module`` is where the generated code imports the helper from::

        if self.weight.dtype == torch.float16:                          # before
            hidden_states = hidden_states.to(torch.float16)
        hidden_states = cast_to_half_weight(hidden_states, self.weight)  # after
    """

    DESCRIPTION = "if weight.dtype == float16: x = x.to(float16) -> x = cast_to_half_weight(x, weight)"
    HELPER = "cast_to_half_weight"

    def _cast_idiom(self, x: m.BaseExpressionMatchType) -> m.If:
        """``if <weight>.dtype == torch.float16: <x> = <x>.to(torch.float16)``, no else."""
        half = self.resolves_to(*FLOAT16)
        weight_is_half = m.Comparison(
            left=m.Attribute(value=m.SaveMatchedNode(m.Attribute(), "weight"), attr=m.Name("dtype")),
            comparisons=[m.ComparisonTarget(m.Equal(), half)])
        cast = m.Assign(targets=[m.AssignTarget(x)],
                        value=m.Call(func=m.Attribute(value=x, attr=m.Name("to")),
                                     args=[m.Arg(half, keyword=None, star="")]))
        return m.If(test=weight_is_half, body=block(cast), orelse=None)

    def candidate(self, node: cst.If) -> bool:
        return _tests_dtype(node.test)

    def rewrite(self, node: cst.If) -> cst.Assign | None:
        found = self.extract(node, self._cast_idiom(m.SaveMatchedNode(m.Name(), "x")))
        if found is None:
            return None
        x, weight = found["x"], found["weight"]
        assert isinstance(x, cst.Name) and isinstance(weight, cst.Attribute)
        if not self.matches(node, self._cast_idiom(m.Name(x.value))):
            return None  # casts another variable than it assigns
        return cst.Assign(targets=[cst.AssignTarget(cst.Name(x.value))],
                          value=self.helper_call(cst.Name(x.value), weight.deep_clone()))
