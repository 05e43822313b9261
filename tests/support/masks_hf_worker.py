"""HF's own eager masks (``transformers.masking_utils`` of one 5.x release), computed in a process of its own.

tests/test_stateless_masks.py runs it once and compares stateless/masks.py with what it wrote:

    PYTHONPATH=.venv/transformers/5.23.0 python tests/masks_hf_worker.py --release 5.23.0 \\
        --install-dir .venv/transformers/5.23.0 --out hf_masks.pt

The file (``torch.save``, loadable with ``weights_only=True``) holds ``{"signatures": {function:
[[name, kind, repr(default)], ...]}, "cases": [...]}``, each signature the function's own under any decorator
(5.24's ``deprecate_kwarg`` shows an extra keyword-only alias); a case is ``{"name", "function",
"is_causal", "kwargs", "expected"}``: the tensors and flags HF's function was called with (all by
name, besides ``config=T5Config(attn_implementation="eager")``, with ``is_causal=False`` where the
case says so; no cache) and what it returned, a tensor or None.  Exit 2 when the process imported
another transformers than asked.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: run as a script, it imports the support package
sys.path.insert(1, str(Path(__file__).resolve().parents[2]))  # the repository: families (support.release_process reads it)
from support.release_process import wrong_release  # noqa: E402

FUNCTIONS = ("create_causal_mask", "create_bidirectional_mask")
# name -> (function, config.is_causal, cross-attention): the calls T5Stack makes, and the causal
# function under a config with is_causal=False, which HF turns into the bidirectional mask.
KINDS = {
    "causal": ("create_causal_mask", True, False),
    "causal-off": ("create_causal_mask", False, False),
    "bidirectional": ("create_bidirectional_mask", True, False),
    "cross": ("create_bidirectional_mask", True, True),
}
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# (batch, query length, key length of the cross-attention cases)
SHAPES = ((1, 1, 1), (1, 5, 7), (3, 5, 7), (3, 1, 4), (2, 6, 1))
MASKS = ("none", "long", "bool", "float", "fraction", "ones", "padded-row")
HIDDEN = 4


def padding_mask(kind: str, batch: int, length: int, dtype: torch.dtype) -> torch.Tensor | None:
    """A (batch, length) 2D mask, 1 (or nonzero) where a key is a token, 0 where it is padding."""
    bits = torch.randint(0, 2, (batch, length))
    if kind == "none":
        return None
    if kind == "long":
        return bits
    if kind == "bool":
        return bits.bool()
    if kind == "float":
        return bits.to(dtype)
    if kind == "fraction":  # HF casts to bool: any nonzero value attends
        return bits * torch.tensor([0.25, 1.0])[torch.randint(0, 2, (batch, length))]
    if kind == "ones":  # nothing padded: HF's bidirectional masks are None here
        return torch.ones(batch, length, dtype=torch.long)
    if kind == "padded-row":  # one sequence entirely padding
        bits[0] = 0
        return bits
    raise ValueError(kind)


def cases() -> Iterator[tuple[str, str, bool, dict[str, Any]]]:
    """(name, function, is_causal, keyword arguments other than config); seeded, so the same every run."""
    torch.manual_seed(0)
    for kind, (function, is_causal, cross) in KINDS.items():
        for dtype_name, dtype in DTYPES.items():
            for batch, q_length, cross_length in SHAPES:
                for mask in MASKS:
                    kv_length = cross_length if cross else q_length
                    kwargs: dict[str, Any] = {"inputs_embeds": torch.randn(batch, q_length, HIDDEN, dtype=dtype),
                                              "attention_mask": padding_mask(mask, batch, kv_length, dtype)}
                    if function == "create_causal_mask":
                        kwargs["past_key_values"] = None
                    if cross:
                        kwargs["encoder_hidden_states"] = torch.randn(batch, kv_length, HIDDEN, dtype=dtype)
                    yield f"{kind}-{mask}-{dtype_name}-b{batch}q{q_length}kv{kv_length}", function, is_causal, kwargs
    # Arguments HF accepts and, in these calls, does not read; a mask is materialized where HF may skip it.
    embeds, attention = torch.randn(2, 5, HIDDEN), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    positions = torch.arange(5).expand(2, 5)
    yield ("causal-position-ids-with-mask", "create_causal_mask", True,
           {"inputs_embeds": embeds, "attention_mask": attention, "past_key_values": None, "position_ids": positions})
    yield ("causal-off-position-ids-no-mask", "create_causal_mask", False,
           {"inputs_embeds": embeds, "attention_mask": None, "past_key_values": None, "position_ids": positions})
    yield ("causal-no-skip", "create_causal_mask", True,
           {"inputs_embeds": embeds, "attention_mask": None, "past_key_values": None, "allow_is_causal_skip": False})
    yield ("bidirectional-no-skip", "create_bidirectional_mask", True,
           {"inputs_embeds": embeds, "attention_mask": None, "allow_is_bidirectional_skip": False})
    yield ("bidirectional-extra-kwarg", "create_bidirectional_mask", True,
           {"inputs_embeds": embeds, "attention_mask": attention, "position_ids": positions})
    # Sizes and dtype from where HF reads them: kv_len from a mask longer than the queries,
    # batch and dtype from encoder_hidden_states rather than inputs_embeds.
    longer = torch.tensor([[1, 1, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]])
    yield ("causal-mask-longer-than-queries", "create_causal_mask", True,
           {"inputs_embeds": embeds, "attention_mask": longer, "past_key_values": None})
    yield ("bidirectional-mask-longer-than-queries", "create_bidirectional_mask", True,
           {"inputs_embeds": embeds, "attention_mask": longer})
    encoder = torch.randn(2, 7, HIDDEN, dtype=torch.bfloat16)
    yield ("cross-dtype-of-encoder", "create_bidirectional_mask", True,
           {"inputs_embeds": embeds, "attention_mask": longer, "encoder_hidden_states": encoder})
    yield ("cross-batch-of-encoder", "create_bidirectional_mask", True,
           {"inputs_embeds": embeds[:1], "attention_mask": longer, "encoder_hidden_states": encoder})
    yield ("cross-batch-and-dtype-of-encoder-no-mask", "create_bidirectional_mask", True,
           {"inputs_embeds": embeds[:1], "attention_mask": None, "encoder_hidden_states": encoder})


def signature(function: Any) -> list[list[str]]:
    return [[p.name, p.kind.name, repr(p.default)] for p in inspect.signature(function).parameters.values()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--install-dir", type=Path, required=True, help="the release's side-by-side install")
    parser.add_argument("--out", type=Path, required=True, help="where the results go (torch.save)")
    args = parser.parse_args(argv)
    problem = wrong_release(args.release, args.install_dir)
    if problem:
        print(f"masks-hf-worker: {problem}", file=sys.stderr)
        return 2
    from transformers import T5Config, masking_utils

    # T5's config has no is_causal: HF's getattr default (True) is the causal case.
    configs = {True: T5Config(attn_implementation="eager"), False: T5Config(attn_implementation="eager", is_causal=False)}
    records = [{"name": name, "function": function, "is_causal": is_causal, "kwargs": kwargs,
                "expected": getattr(masking_utils, function)(config=configs[is_causal], **kwargs)}
               for name, function, is_causal, kwargs in cases()]
    torch.save({"signatures": {name: signature(inspect.unwrap(getattr(masking_utils, name))) for name in FUNCTIONS},
                "cases": records}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
