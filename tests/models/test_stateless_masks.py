"""stateless/masks.py: equal to the newest verified transformers' own eager masks, traceable by fx and torch.export.

HF's masks come from one process importing exactly that release (tests/support/masks_hf_worker.py, run
with PYTHONPATH=.venv/transformers/<release>); this process calls ours on the same tensors, with a
real T5Config of the suite's transformers.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx
from conftest import load_script
from support import SUPPORT
from support.masks_hf_worker import FUNCTIONS
from support.release_process import environment
from torch.export import Dim
from torch.nn.attention.flex_attention import BlockMask

import stateless
from stateless import create_bidirectional_mask, create_causal_mask
from stateless.dtypes import finfo

WORKER = SUPPORT / "masks_hf_worker.py"
OURS: dict[str, Callable[..., Any]] = {"create_causal_mask": create_causal_mask, "create_bidirectional_mask": create_bidirectional_mask}

installer = load_script("install_releases")
# The newest release: its masking_utils takes the cache as `cache` (5.24 on), and maps the `past_key_values` these
# calls pass through its own deprecate_kwarg, as the generated code (renamed_keywords) passes it to ours.
RELEASE = installer.verified_releases()[-1]


def t5_config(is_causal: bool = True) -> Any:
    """A real T5Config; T5's has no is_causal attribute, so only the bidirectional case sets one."""
    from transformers import T5Config

    return T5Config() if is_causal else T5Config(is_causal=False)


def hf_results(scratch: Path) -> dict[str, Any]:
    """What the newest transformers' masking_utils returned, case by case (one process for all)."""
    install = installer.install_dir(RELEASE)
    assert install.is_dir(), f"no transformers {RELEASE} in {install}: run bash scripts/setup.sh"
    out = scratch / "masks.pt"
    proc = subprocess.run([sys.executable, str(WORKER), "--release", RELEASE, "--install-dir", str(install),
                           "--out", str(out)], env=environment(install), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and out.is_file(), f"masks worker exit {proc.returncode}: {proc.stderr[-3000:]}"
    return torch.load(out, weights_only=True)


def hf_skips(case: dict[str, Any]) -> bool:
    """Where HF's eager masks are None: a bidirectional mask (the function, or is_causal False) with nothing
    padded, unless the call forbids the skip (create_causal_mask passes its flag on when is_causal is False)."""
    kwargs = case["kwargs"]
    mask = kwargs["attention_mask"]
    bidirectional = case["function"] == "create_bidirectional_mask" or not case["is_causal"]
    allowed = kwargs.get("allow_is_bidirectional_skip", kwargs.get("allow_is_causal_skip", True))
    return bidirectional and allowed and (mask is None or bool(mask.bool().all()))


def expected_layout(case: dict[str, Any]) -> tuple[tuple[int, ...], torch.dtype]:
    """(batch, 1, q_len, kv_len) and dtype, read off the inputs as HF's docstrings say."""
    kwargs = case["kwargs"]
    embeds, encoder = kwargs["inputs_embeds"], kwargs.get("encoder_hidden_states")
    source = embeds if encoder is None else encoder
    mask = kwargs["attention_mask"]
    kv = mask.shape[-1] if mask is not None else (embeds.shape[1] if encoder is None else encoder.shape[1])
    return (source.shape[0], 1, embeds.shape[1], kv), source.dtype


def ours(case: dict[str, Any], **changes: Any) -> torch.Tensor:
    return OURS[case["function"]](config=t5_config(case["is_causal"]), **{**case["kwargs"], **changes})


def declared_renames() -> dict[str, str]:
    """New name -> old name, as the release's masking_utils declares them (``@deprecate_kwarg(old, version,
    new_name=new)``): the generated code passes the old names (transforms/renamed_keywords.py)."""
    source = (installer.install_dir(RELEASE) / "transformers" / "masking_utils.py").read_text()
    return {new: old for old, new in re.findall(r'@deprecate_kwarg\(\s*"(\w+)",[^)]*?new_name="(\w+)"', source)}


def signature_problems(hf: dict[str, Any]) -> list[str]:
    """Same parameter names, order, kinds and defaults as HF's with its renames undone: the redirected call binds
    the same way."""
    assert set(hf["signatures"]) == set(FUNCTIONS) == set(OURS)
    renames = declared_renames()
    problems = []
    for name, function in OURS.items():
        mine = [[p.name, p.kind.name, repr(p.default)] for p in inspect.signature(function).parameters.values()]
        theirs = [[renames.get(parameter, parameter), *rest] for parameter, *rest in hf["signatures"][name]]
        if mine != theirs:
            problems.append(f"{name}: {mine} != HF's {theirs} (renames undone: {renames})")
    return problems


def built_mask_problems(hf: dict[str, Any]) -> list[str]:
    """Where HF builds a mask, ours is equal: values, dtype and shape."""
    built = [case for case in hf["cases"] if case["expected"] is not None]
    assert len(built) >= 250
    problems = []
    for case in built:
        got, expected = ours(case), case["expected"]
        if got.dtype != expected.dtype or got.shape != expected.shape or not torch.equal(got, expected):
            problems.append(f"{case['name']}: {got.dtype} {tuple(got.shape)} vs HF {expected.dtype} "
                            f"{tuple(expected.shape)}, {int((got != expected).sum())} elements differ")
        elif (got.shape, got.dtype) != expected_layout(case):
            problems.append(f"{case['name']}: HF's mask is not laid out as this test expects")
    return problems


def skipped_mask_problems(hf: dict[str, Any]) -> list[str]:
    """HF skips exactly the unpadded bidirectional masks; there ours is all zero (adding it changes nothing)."""
    skipped = [case for case in hf["cases"] if case["expected"] is None]
    assert len(skipped) >= 100
    assert [case["name"] for case in hf["cases"] if hf_skips(case)] == [case["name"] for case in skipped]
    problems = []
    for case in skipped:
        got = ours(case)
        shape, dtype = expected_layout(case)
        if got.shape != shape or got.dtype != dtype or not torch.equal(got, torch.zeros(shape, dtype=dtype)):
            problems.append(f"{case['name']}: {got.dtype} {tuple(got.shape)}, {int(got.count_nonzero())} nonzero")
    return problems


def indiscriminate_cases(hf: dict[str, Any]) -> list[str]:
    """The comparison can fail: a mask ignoring the padding, or causality, differs from HF on these cases."""
    padded = [case for case in hf["cases"] if case["expected"] is not None and case["kwargs"]["attention_mask"]
              is not None and not case["kwargs"]["attention_mask"].bool().all()]
    # causal masks where some query does not see a later key that is not padding
    causal = [case for case in hf["cases"] if case["expected"] is not None and case["function"] ==
              "create_causal_mask" and case["is_causal"] and case["kwargs"]["inputs_embeds"].shape[1] > 1 and
              (case["kwargs"]["attention_mask"] is None or bool(case["kwargs"]["attention_mask"][:, 1:].bool().any()))]
    assert len(padded) >= 150 and len(causal) >= 60
    # (position_ids dropped too: without a mask they would be refused)
    problems = [f"{case['name']}: unchanged without its padding mask" for case in padded
                if torch.equal(ours(case, attention_mask=None, position_ids=None), case["expected"])]
    for case in causal:
        kwargs = {k: v for k, v in case["kwargs"].items() if k != "past_key_values"}
        if torch.equal(create_bidirectional_mask(t5_config(), **kwargs), case["expected"]):
            problems.append(f"{case['name']}: the bidirectional mask equals the causal one")
    return problems


def test_equal_to_hf(tmp_path: Path) -> None:
    """One test, so that one process computes HF's masks even when xdist spreads the tests over workers."""
    hf = hf_results(tmp_path)
    problems = {check.__name__: check(hf) for check in (signature_problems, built_mask_problems,
                                                         skipped_mask_problems, indiscriminate_cases)}
    assert not any(problems.values()), "\n".join(f"{check}: {problem}" for check, found in problems.items()
                                                 for problem in found[:10])


# -- tracing ------------------------------------------------------------------------------------

class Masks(torch.nn.Module):
    """The four calls a 5.x T5Stack (and a decoder config with is_causal=False) makes, on real configs."""

    def __init__(self) -> None:
        super().__init__()
        self.config, self.bidirectional_config = t5_config(), t5_config(is_causal=False)

    def forward(self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None,
                encoder_hidden_states: torch.Tensor, encoder_attention_mask: torch.Tensor | None) -> tuple:
        return (
            create_causal_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                               past_key_values=None),
            create_causal_mask(config=self.bidirectional_config, inputs_embeds=inputs_embeds,
                               attention_mask=attention_mask, past_key_values=None),
            create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask),
            create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds,
                                      attention_mask=encoder_attention_mask,
                                      encoder_hidden_states=encoder_hidden_states),
        )


def sample(batch: int, q: int, kv: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple:
    generator = torch.Generator().manual_seed(seed)
    mask = torch.randint(0, 2, (batch, q), generator=generator)
    mask[:, 0] = 1
    return (torch.randn(batch, q, 8, generator=generator).to(dtype), mask,
            torch.randn(batch, kv, 8, generator=generator).to(dtype), torch.randint(0, 2, (batch, kv), generator=generator))


def assert_same(got: tuple, expected: tuple) -> None:
    assert len(got) == len(expected) == 4
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), f"output {i}"


def test_fx_trace_equals_eager_on_other_shapes_and_dtypes() -> None:
    model = Masks()
    graph = torch.fx.symbolic_trace(model)
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert targets.count(finfo) == 4, "finfo of a traced dtype is one leaf call per mask"
    for args in (sample(3, 5, 7), sample(2, 4, 6, torch.bfloat16, seed=1), sample(1, 1, 3, torch.float16, seed=2)):
        assert_same(graph(*args), model(*args))


def test_fx_trace_without_masks() -> None:
    model = Masks()
    graph = torch.fx.symbolic_trace(model, concrete_args={"attention_mask": None, "encoder_attention_mask": None})
    for batch, q, kv in ((3, 5, 7), (2, 4, 1)):
        embeds, _, encoder, _ = sample(batch, q, kv)
        got, expected = graph(embeds, None, encoder, None), model(embeds, None, encoder, None)
        assert_same(got, expected)
        assert not bool(expected[0].eq(0).all()) and bool(expected[2].eq(0).all())


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
def test_export_with_dynamic_dims_equals_eager(strict: bool) -> None:
    model = Masks()
    batch, q, kv = Dim("batch"), Dim("q"), Dim("kv")
    exported = torch.export.export(model, sample(3, 5, 7), strict=strict, dynamic_shapes=(
        {0: batch, 1: q}, {0: batch, 1: q}, {0: batch, 1: kv}, {0: batch, 1: kv}))
    for args in (sample(3, 5, 7), sample(2, 4, 9, seed=1)):
        assert_same(exported.module()(*args), model(*args))


# -- refusals -----------------------------------------------------------------------------------

EMBEDS = torch.zeros(2, 3, 4)
CAUSAL: dict[str, Any] = {"config": t5_config(), "inputs_embeds": EMBEDS, "attention_mask": None, "past_key_values": None}
BIDIRECTIONAL: dict[str, Any] = {"config": t5_config(), "inputs_embeds": EMBEDS, "attention_mask": None}
BLOCK_MASK = BlockMask.from_kv_blocks(torch.ones(1, 1, 1, dtype=torch.int32), torch.zeros(1, 1, 1, 1, dtype=torch.int32))
# case -> (function, a valid call, the change it refuses, the argument its message names)
REFUSED: dict[str, tuple[Callable[..., Any], dict[str, Any], dict[str, Any], str]] = {
    "causal-cache": (create_causal_mask, CAUSAL, {"past_key_values": object()}, "past_key_values"),
    "causal-or": (create_causal_mask, CAUSAL, {"or_mask_function": lambda b, h, q, kv: q >= 0}, "or_mask_function"),
    "causal-and": (create_causal_mask, CAUSAL, {"and_mask_function": lambda b, h, q, kv: q >= 0}, "and_mask_function"),
    "causal-blocks": (create_causal_mask, CAUSAL, {"block_sequence_ids": torch.zeros(2, 3)}, "block_sequence_ids"),
    "causal-layer": (create_causal_mask, CAUSAL, {"layer_idx": 0}, "layer_idx"),
    "causal-packed": (create_causal_mask, CAUSAL, {"position_ids": torch.arange(3)[None]}, "position_ids"),
    "causal-4d": (create_causal_mask, CAUSAL, {"attention_mask": torch.zeros(2, 1, 3, 3)}, "attention_mask"),
    "causal-1d": (create_causal_mask, CAUSAL, {"attention_mask": torch.ones(3)}, "attention_mask"),
    "causal-block-mask": (create_causal_mask, CAUSAL, {"attention_mask": BLOCK_MASK}, "attention_mask"),
    "causal-off-cache": (create_causal_mask, {**CAUSAL, "config": t5_config(is_causal=False)},
                         {"past_key_values": object()}, "past_key_values"),
    "causal-off-blocks": (create_causal_mask, {**CAUSAL, "config": t5_config(is_causal=False)},
                          {"block_sequence_ids": torch.zeros(2, 3)}, "block_sequence_ids"),
    "bidirectional-cache": (create_bidirectional_mask, BIDIRECTIONAL, {"past_key_values": object()}, "past_key_values"),
    "bidirectional-or": (create_bidirectional_mask, BIDIRECTIONAL, {"or_mask_function": lambda b, h, q, kv: q >= 0},
                         "or_mask_function"),
    "bidirectional-and": (create_bidirectional_mask, BIDIRECTIONAL, {"and_mask_function": lambda b, h, q, kv: q >= 0},
                          "and_mask_function"),
    "bidirectional-4d": (create_bidirectional_mask, BIDIRECTIONAL, {"attention_mask": torch.zeros(2, 1, 3, 3)},
                         "attention_mask"),
    "bidirectional-3d": (create_bidirectional_mask, BIDIRECTIONAL, {"attention_mask": torch.ones(2, 3, 3)},
                         "attention_mask"),
    "bidirectional-block-mask": (create_bidirectional_mask, BIDIRECTIONAL, {"attention_mask": BLOCK_MASK},
                                 "attention_mask"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refuses_what_a_cacheless_eager_mask_is_not(case: str) -> None:
    function, base, change, argument = REFUSED[case]
    with pytest.raises(ValueError, match=rf"^{function.__name__}: {argument}\b"):
        function(**{**base, **change})


def test_the_refused_calls_are_accepted_without_the_argument() -> None:
    """The bases are valid calls: each refusal above is due to its argument alone."""
    for function, base, _, _ in REFUSED.values():
        assert function(**base).shape == (2, 1, 3, 3)


def test_a_traced_cache_is_refused_under_fx() -> None:
    """A Proxy is never None: passing a traced value as past_key_values fails the trace, naming it."""

    class WithCache(torch.nn.Module):
        def forward(self, inputs_embeds: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
            return create_causal_mask(t5_config(), inputs_embeds, None, cache)

    with pytest.raises(ValueError, match="past_key_values"):
        torch.fx.symbolic_trace(WithCache())


def test_exported_from_the_package() -> None:
    assert {"create_causal_mask", "create_bidirectional_mask"} <= set(stateless.__all__)
