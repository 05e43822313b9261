"""HF's clamp of infinite float16 activations -> a call to the fx leaf ``clamp_inf_fp16``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from transforms.library.leaf_helper import FLOAT16, LeafHelperRewrite, block


def _positional(value: m.BaseExpressionMatchType) -> m.Arg:
    return m.Arg(value, keyword=None, star="")


def _keyword(name: str, value: m.BaseExpressionMatchType) -> m.Arg:
    return m.Arg(value, keyword=m.Name(name))


class Fp16Clamp(LeafHelperRewrite):
    """Replace HF's "clamp inf values to enable fp16 training" block with ``clamp_inf_fp16``.

    The guard reads tensor data (``torch.isinf(x).any()``), which neither
    ``symbolic_trace`` nor torch.export can branch on; the helper selects the
    clamped tensor with ``torch.where`` instead.  Leading comments stay; a block
    whose bound is read elsewhere is left alone with a warning.  The guard may
    also fire on NaN elements (``... and (torch.isinf(x).any() or
    torch.isnan(x).any())``, BART's encoder layer, or ``... and not
    torch.isfinite(x).all()``, its 5.x form); the helper then gets ``nan=True``.  Option ``module`` is where the generated code imports the
    helper from::

        if hidden_states.dtype == torch.float16 and torch.isinf(hidden_states).any():  # before
            clamp_value = torch.finfo(hidden_states.dtype).max - 1000
            hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
        hidden_states = clamp_inf_fp16(hidden_states)                                  # after
    """

    DESCRIPTION = "if x is float16 and has inf: clamp x -> x = clamp_inf_fp16(x)"
    HELPER = "clamp_inf_fp16"

    def _clamp_idiom(self, x: m.BaseExpressionMatchType, bound: m.BaseExpressionMatchType) -> m.If:
        """``if x.dtype == torch.float16 and torch.isinf(x).any(): bound = ...; x = torch.clamp(x, ...)``."""
        x_dtype = m.Attribute(value=x, attr=m.Name("dtype"))
        is_half = m.Comparison(left=x_dtype, comparisons=[m.ComparisonTarget(m.Equal(), self.resolves_to(*FLOAT16))])
        has_inf = self._any(x, "torch.isinf")
        has_inf_or_nan = m.BooleanOperation(left=has_inf, operator=m.Or(), right=self._any(x, "torch.isnan"))
        # 5.x: ``not torch.isfinite(x).all()``, the same inf-or-NaN guard.
        not_finite = m.UnaryOperation(operator=m.Not(), expression=m.Call(
            func=m.Attribute(value=m.Call(func=self.resolves_to("torch.isfinite"), args=[_positional(x)]),
                             attr=m.Name("all")), args=[]))
        finfo_max = m.Attribute(value=m.Call(func=self.resolves_to("torch.finfo"), args=[_positional(x_dtype)]),
                                attr=m.Name("max"))
        bound_value = m.Assign(targets=[m.AssignTarget(bound)],
                               value=m.BinaryOperation(left=finfo_max, operator=m.Subtract(), right=m.Integer("1000")))
        low = m.UnaryOperation(operator=m.Minus(), expression=bound)
        clamp_args = m.OneOf(
            [_positional(x), _positional(low), _positional(bound)],
            [_positional(x), _positional(low), _keyword("max", bound)],
            [_positional(x), _keyword("min", low), _keyword("max", bound)],
            [_positional(x), _keyword("max", bound), _keyword("min", low)],
        )
        clamp = m.Assign(targets=[m.AssignTarget(x)],
                         value=m.Call(func=self.resolves_to("torch.clamp"), args=clamp_args))
        return m.If(test=m.BooleanOperation(left=is_half, operator=m.And(), right=has_inf | has_inf_or_nan | not_finite),
                    body=block(bound_value, clamp), orelse=None)

    def _any(self, x: m.BaseExpressionMatchType, test: str) -> m.Call:
        """``<test>(x).any()``."""
        return m.Call(func=m.Attribute(value=m.Call(func=self.resolves_to(test), args=[_positional(x)]),
                                       attr=m.Name("any")), args=[])

    def candidate(self, node: cst.If) -> bool:
        test = node.test  # ``<x>.dtype == ... and ...``
        return isinstance(test, cst.BooleanOperation) and isinstance(test.left, cst.Comparison) \
            and isinstance(test.left.left, cst.Attribute) and test.left.left.attr.value == "dtype"

    def rewrite(self, node: cst.If) -> cst.Assign | None:
        names = self._idiom_names(node)
        if names is None:
            return None
        x, bound = names
        if self._read_outside_idioms(bound):
            self.warn(f"fp16 clamp of {x.value!r} kept: {bound.value!r} is read outside the block")
            return None
        call = self.helper_call(cst.Name(x.value))
        test = node.test
        assert isinstance(test, cst.BooleanOperation)
        if isinstance(test.right, (cst.BooleanOperation, cst.UnaryOperation)):  # the guard also fires on NaN
            call = call.with_changes(args=[*call.args, cst.Arg(cst.Name("True"), keyword=cst.Name("nan"), equal=cst.AssignEqual(
                cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))])
        return cst.Assign(targets=[cst.AssignTarget(cst.Name(x.value))], value=call)

    def _idiom_names(self, node: cst.If) -> tuple[cst.Name, cst.Name] | None:
        """The clamped variable and the assigned bound, if ``node`` is the idiom."""
        found = self.extract(node, self._clamp_idiom(m.SaveMatchedNode(m.Name(), "x"),
                                                     m.SaveMatchedNode(m.Name(), "bound")))
        if found is None:
            return None
        x, bound = found["x"], found["bound"]
        assert isinstance(x, cst.Name) and isinstance(bound, cst.Name)
        # The first match saved one occurrence of each; this one requires all to agree.
        if x.value == bound.value or not self.matches(node, self._clamp_idiom(m.Name(x.value),
                                                                              m.Name(bound.value))):
            return None
        return x, bound

    def _read_outside_idioms(self, bound: cst.Name) -> bool:
        """Whether the variable ``bound`` is read anywhere but inside a clamp idiom.

        Scope analysis is flow-insensitive: every clamp block of a function
        assigns and reads the same name, but only its own assignment reaches
        its read, so reads inside clamp blocks are harmless.
        """
        _, reads = self.index.local_uses(bound)
        return not all(self._in_idiom_of(read, bound.value) for read in reads)

    def _in_idiom_of(self, read: cst.Name, bound: str) -> bool:
        return any(isinstance(node, cst.If) and (names := self._idiom_names(node)) is not None
                   and names[1].value == bound for node in self.index.ancestors(read))
