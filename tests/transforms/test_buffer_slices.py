import torch
import torch.fx
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from transforms.buffer_slices import BufferSlices

ATTENTION = """\
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, n_ctx):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((n_ctx, n_ctx), dtype=torch.uint8)).view(1, 1, n_ctx, n_ctx))
        self.table = torch.zeros(n_ctx)

    def forward(self, w):
        nd, ns = w.size(-2), w.size(-1)
        mask = self.bias[:, :, ns - nd : ns, :ns]
        tail = self.bias[:, :, nd:, 1:3]
        return torch.where(mask.bool(), w, torch.tensor(-1e4)) + tail.sum()
"""


def test_buffer_slices_by_traced_sizes_become_narrow_calls() -> None:
    assert_rewrites(BufferSlices, ATTENTION, ATTENTION.replace(
        "self.bias[:, :, ns - nd : ns, :ns]", "self.bias.narrow(2, ns - nd, ns - (ns - nd)).narrow(3, 0, ns)").replace(
        "self.bias[:, :, nd:, 1:3]", "self.bias.narrow(2, nd, self.bias.size(2) - nd).narrow(3, 1, 3 - 1)"))


def test_literal_slices_attributes_that_are_not_buffers_and_steps_are_left_alone() -> None:
    assert_unchanged(BufferSlices, """\
        class M(nn.Module):
            def __init__(self):
                self.register_buffer("bias", torch.ones(4, 4))
                self.table = torch.ones(4)

            def forward(self, n):
                return self.bias[:2, 1:] + self.table[:n] + self.bias[::n] + self.bias[n] + other.bias[:n]
        """)


def test_the_rewrite_traces_with_fx_and_computes_what_slicing_did() -> None:
    namespace: dict = {}
    exec(compile(run(BufferSlices, ATTENTION), "<rewritten>", "exec"), namespace)
    original: dict = {}
    exec(compile(ATTENTION, "<original>", "exec"), original)
    model, reference = namespace["Attention"](8), original["Attention"](8)
    graph = torch.fx.symbolic_trace(model)
    buffers = {n.target for n in graph.graph.nodes if n.op == "get_attr" and "constant" not in n.target}
    assert buffers == {"bias"}  # the module's buffer, not a copy baked into the graph
    for shape in [(2, 3, 5, 5), (1, 2, 3, 7)]:
        w = torch.randn(shape)
        assert torch.equal(graph(w), reference(w))
    try:
        torch.fx.symbolic_trace(reference)
    except TypeError as error:
        assert "slice indices must be integers" in str(error)
    else:
        raise AssertionError("the original traces: the test proves nothing")


EMBEDDINGS = """\
class Embeddings(nn.Module):
    def __init__(self):
        self.register_buffer("token_type_ids", torch.zeros((1, 8), dtype=torch.long))


class Model(nn.Module):
    def forward(self, input_ids):
        seq_length = input_ids.shape[1]
        ids = self.embeddings.token_type_ids[:, :seq_length]
        table = self.embeddings.table[:, :seq_length] + self.token_type_ids[:, :seq_length]
        return ids, table, other.embeddings.token_type_ids[:, :seq_length]
"""


def test_a_submodules_buffer_is_rewritten_too() -> None:
    """BERT 4.10's BertModel slices its embeddings' buffer (``self.token_type_ids`` is no buffer of Model's)."""
    assert_rewrites(BufferSlices, EMBEDDINGS, EMBEDDINGS.replace(
        "ids = self.embeddings.token_type_ids[:, :seq_length]",
        "ids = self.embeddings.token_type_ids.narrow(1, 0, seq_length)"))


FUNCTION = """\
class Attention(nn.Module):
    def __init__(self, n_ctx):
        self.register_buffer("bias", torch.ones((1, 1, n_ctx, n_ctx)))


def eager_attention_forward(module, query, key):
    query_length, key_length = query.size(-2), key.size(-2)
    return module.bias[:, :, key_length - query_length : key_length, :key_length]


def other(module, n):
    return module.bias[:, :n]
"""


def test_a_named_functions_module_parameter_slices_buffers_of_the_files_classes() -> None:
    """GPT-2 4.51's module-level attention function slices its module's causal-mask buffer."""
    rewritten = FUNCTION.replace(
        "module.bias[:, :, key_length - query_length : key_length, :key_length]",
        "module.bias.narrow(2, key_length - query_length, key_length - (key_length - query_length))"
        ".narrow(3, 0, key_length)")
    assert_rewrites(BufferSlices, FUNCTION, rewritten, functions=["eager_attention_forward"])
    assert_unchanged(BufferSlices, FUNCTION)  # no function named: module-level code is left alone


def test_a_buffer_assigned_as_nn_buffer_is_found_like_a_registered_one() -> None:
    # transformers 5.x: `self.position_ids = nn.Buffer(...)` instead of register_buffer (BERT's embeddings).
    assert_rewrites(BufferSlices, """\
        class Embeddings(nn.Module):
            def __init__(self, n):
                self.position_ids = nn.Buffer(torch.arange(n).expand((1, -1)), persistent=False)
                self.table = torch.arange(n)

            def forward(self, seq_length, past):
                return self.position_ids[:, past : seq_length + past] + self.table[:seq_length]
        """, """\
        class Embeddings(nn.Module):
            def __init__(self, n):
                self.position_ids = nn.Buffer(torch.arange(n).expand((1, -1)), persistent=False)
                self.table = torch.arange(n)

            def forward(self, seq_length, past):
                return self.position_ids.narrow(1, past, (seq_length + past) - past) + self.table[:seq_length]
        """)
