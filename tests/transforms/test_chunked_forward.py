import pytest
import torch
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from transforms.chunked_forward import ChunkedForward
from transforms.library.base import TransformError

HELPER = "from transformers.modeling_utils import apply_chunking_to_forward\n"


def test_the_unchunked_case_calls_the_forward_directly() -> None:
    assert_rewrites(ChunkedForward, HELPER + """\
class Layer:
    def forward(self, attention_output):
        layer_output = apply_chunking_to_forward(
            self.feed_forward_chunk, self.chunk_size_feed_forward, self.seq_len_dim, attention_output
        )
        return layer_output
""", HELPER + """\
class Layer:
    def forward(self, attention_output):
        layer_output = (apply_chunking_to_forward(
            self.feed_forward_chunk, self.chunk_size_feed_forward, self.seq_len_dim, attention_output
        ) if self.chunk_size_feed_forward > 0 else self.feed_forward_chunk(attention_output))
        return layer_output
""")


def test_several_inputs_and_a_module_alias() -> None:
    assert_rewrites(ChunkedForward, "from transformers import modeling_utils as mu\n"
                    "y = mu.apply_chunking_to_forward(fn, size, 1, a, b)\n",
                    "from transformers import modeling_utils as mu\n"
                    "y = (mu.apply_chunking_to_forward(fn, size, 1, a, b) if size > 0 else fn(a, b))\n")


def test_a_relative_import_inside_transformers_resolves() -> None:
    code = "from ...modeling_utils import apply_chunking_to_forward\ny = apply_chunking_to_forward(f, n, 1, x)\n"
    result = run(ChunkedForward, code, module_name="transformers.models.bert.modeling_bert")
    assert result.endswith("y = (apply_chunking_to_forward(f, n, 1, x) if n > 0 else f(x))\n")


def test_another_function_of_that_name_is_left_alone() -> None:
    assert_unchanged(ChunkedForward,
                     "def apply_chunking_to_forward(*a):\n    pass\ny = apply_chunking_to_forward(f, 0, 1, x)\n")
    assert_unchanged(ChunkedForward, "y = 1\n")


@pytest.mark.parametrize("call,error", [
    ("apply_chunking_to_forward(self.make(), n, 1, x)", "would be evaluated twice"),
    ("apply_chunking_to_forward(f, get_size(), 1, x)", "would be evaluated twice"),
    ("apply_chunking_to_forward(f, n, 1)", "passed positionally"),
    ("apply_chunking_to_forward(f, n, 1, *xs)", "passed positionally"),
    ("apply_chunking_to_forward(f, chunk_size=n, chunk_dim=1, x=x)", "passed positionally"),
])
def test_calls_it_cannot_rewrite_exactly_are_errors(call: str, error: str) -> None:
    with pytest.raises(TransformError, match=error):
        run(ChunkedForward, HELPER + f"y = {call}\n")


def test_the_rewrite_computes_what_the_helper_does() -> None:
    from transformers.modeling_utils import apply_chunking_to_forward

    namespace: dict = {}
    exec(run(ChunkedForward, HELPER + "def apply(f, n, x):\n    return apply_chunking_to_forward(f, n, 1, x)\n"),
         namespace)
    def feed_forward(hidden: torch.Tensor) -> torch.Tensor:  # the helper reads its signature: no builtin
        return hidden.sin() * 2

    x = torch.randn(2, 6, 3)
    for size in (0, 2, 3):
        assert torch.equal(namespace["apply"](feed_forward, size, x), apply_chunking_to_forward(feed_forward, size, 1, x))
