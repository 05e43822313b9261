"""The decoder-only LLMs' section of ``docs/benchmarks.md``, written when ``bench_partition.py`` runs LLM families only.

    PYTHONPATH=.venv/transformers/5.23.0:. python scripts/bench_partition.py --version 5.23.0 --stages 4,8

The same table as the main run (with torchtitan's and HF's native splits), ours' margin over the uniform
split at K = 4 for the small tied models (the issue asks 20 % or more), and each family's bytes over each cut before and after
recomputation (the causal mask and the rotary cos/sin) at K = 4.  A release's run is a section of its
own, replaced by its own re-runs.
"""

from __future__ import annotations

import argparse

from bench_partition import Row, crossing_table, section

from families.family import ModelFamily

HEADING = "## Pipeline partitioning: decoder-only LLMs (`scripts/bench_partition.py --version {version}`)"
MARGIN_SHAPES = ("llama-3.2-1b", "qwen3-0.6b", "gemma-3-1b")  # the small tied LLMs


def llm_section(args: argparse.Namespace, families: list[ModelFamily], rows: list[Row], setups: list[str],
                load: float) -> tuple[str, str]:
    """(heading, text) of the section."""
    margins = [f"{r['shape']}: {(r['uniform'] - r['ours']) / r['uniform'] * 100:.1f} % "
               f"(ours {r['ours']:.3f}, uniform {r['uniform']:.3f})"
               for r in rows if r["stages"] == 4 and r["shape"] in MARGIN_SHAPES]
    tables = [crossing_table(family, [shape for shape in family.definition.shapes if shape != family.definition.verify_shape
                                      and (args.shape is None or shape in args.shape)])
              for family in families]
    extra = ("\nBottleneck / ideal below uniform at K = 4 (how much shorter the bottleneck stage is): "
             + "; ".join(margins) + ".\n\n### Recompute instead of send: bytes over each cut\n\n"
             + "\n\n".join(tables) + "\n")
    heading = HEADING.format(version=args.version)
    text = section(rows, setups, "", extra, load, heading)
    print(text)
    return heading, text
