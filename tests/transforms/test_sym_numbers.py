import torch
import torch.fx
from support.transform_helpers import assert_rewrites, assert_unchanged, run

from transforms.sym_numbers import SymNumbers


def test_float_and_int_of_sizes_become_sym_calls() -> None:
    assert_rewrites(SymNumbers, """\
        import torch

        def _attn(w, v, x):
            w = w / (float(v.size(-1)) ** 0.5)
            n = int(x.shape[1] * 2) + int(x.dim())
            return w, n
        """, """\
        import torch

        def _attn(w, v, x):
            w = w / (torch.sym_float(v.size(-1)) ** 0.5)
            n = torch.sym_int(x.shape[1] * 2) + torch.sym_int(x.dim())
            return w, n
        """)


def test_torch_is_imported_when_missing() -> None:
    assert_rewrites(SymNumbers, "def f(v):\n    return float(v.size(0))\n",
                    "import torch\n\ndef f(v):\n    return torch.sym_float(v.size(0))\n")


def test_other_conversions_and_shadowed_builtins_are_left_alone() -> None:
    assert_unchanged(SymNumbers, """\
        def f(v, text, float):
            a = int(text)
            b = str(v.size(0))
            c = float(v.size(0))
            return a, b, c

        def g(v):
            return int(v.size(0), 10) + int(config.n_embd)
        """)


def test_the_rewrite_traces_and_computes_what_the_original_did() -> None:
    source = "import torch\n\ndef scale(w, v):\n    return w / (float(v.size(-1)) ** 0.5)\n"
    namespace: dict = {}
    exec(compile(run(SymNumbers, source), "<rewritten>", "exec"), namespace)
    original: dict = {}
    exec(compile(source, "<original>", "exec"), original)
    w, v = torch.randn(2, 3), torch.randn(4, 7)
    graph = torch.fx.symbolic_trace(namespace["scale"])
    assert torch.equal(graph(w, v), original["scale"](w, v))
    assert torch.equal(graph(w, torch.randn(4, 5)), original["scale"](w, torch.randn(4, 5)))
