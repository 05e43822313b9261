"""Call a feed-forward directly when it is not chunked, instead of through HF's chunking helper."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext

from transforms.analysis.purity import is_pure
from transforms.analysis.syntax import code_of
from transforms.library.base import Transform, TransformError

CHUNKING = ("transformers.modeling_utils.apply_chunking_to_forward",)


@dataclass(frozen=True)
class ChunkedForwardOptions:
    functions: tuple[str, ...] = CHUNKING  # qualified names of helpers called as (forward_fn, chunk_size, chunk_dim, *inputs)


class ChunkedForward(Transform):
    """``apply_chunking_to_forward(fn, size, dim, *xs)`` -> ``fn(*xs)`` unless ``size > 0``.

    HF's helper runs ``fn`` on the inputs in chunks when ``size > 0`` and on the
    whole inputs otherwise, but first checks that every input has the same
    length along ``dim`` with ``assert all(x.shape[dim] == ... )``: a bool of a
    traced size, which torch.fx refuses ("symbolically traced variables cannot
    be used as inputs to control flow").  The unchunked case (``size`` 0, every
    released BERT/RoBERTa configuration) becomes a direct call, behind a test of
    the configured size, a plain Python int under every tracer; a chunked
    configuration still goes through the helper, exactly as before::

        layer_output = apply_chunking_to_forward(                                  # before
            self.feed_forward_chunk, self.chunk_size_feed_forward, self.seq_len_dim, attention_output
        )

        layer_output = (apply_chunking_to_forward(                                 # after
            self.feed_forward_chunk, self.chunk_size_feed_forward, self.seq_len_dim, attention_output
        ) if self.chunk_size_feed_forward > 0 else self.feed_forward_chunk(attention_output))

    The forward function and the size are evaluated twice, so both must be free
    of effects (attributes, names); anything else is an error.
    """

    DESCRIPTION = "apply_chunking_to_forward(fn, 0, dim, *xs) -> fn(*xs)"
    Options = ChunkedForwardOptions

    def __init__(self, context: CodemodContext, options: ChunkedForwardOptions | None = None, /,
                 **values: object) -> None:
        super().__init__(context, options, **values)
        self.functions = frozenset(self.options.functions)

    def _is_helper(self, call: cst.Call) -> bool:
        return bool(self.qualified_names(call) & self.functions)

    def focus(self) -> Iterable[cst.CSTNode]:
        return [call for call in self.index.nodes(cst.Call) if self._is_helper(call) and not self._rewritten(call)]

    def _rewritten(self, call: cst.Call) -> bool:
        """A helper call this transform already guarded (the body of its own conditional)."""
        parent = self.index.parent(call)
        return isinstance(parent, cst.IfExp) and parent.body is call

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self._is_helper(original_node) or self._rewritten(original_node):
            return updated_node
        args = updated_node.args
        if len(args) < 4 or any(arg.keyword is not None or arg.star for arg in args):
            raise TransformError(f"`{code_of(original_node)}`: expected (forward_fn, chunk_size, chunk_dim, "
                                 f"*input_tensors) passed positionally")
        function, size = args[0].value, args[1].value
        for part in (function, size):
            if not is_pure(part) or isinstance(part, cst.Call):
                raise TransformError(f"`{code_of(original_node)}`: `{code_of(part)}` would be evaluated twice")
        direct = cst.Call(function.deep_clone(), [cst.Arg(arg.value.deep_clone()) for arg in args[3:]])
        chunked = cst.Comparison(size.deep_clone(), [cst.ComparisonTarget(cst.GreaterThan(), cst.Integer("0"))])
        return cst.IfExp(test=chunked, body=updated_node, orelse=direct,
                         lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
