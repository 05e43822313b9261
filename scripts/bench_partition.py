"""Benchmark the partitioner against the default splits of optimum-graphcore, DeepSpeed, torchtitan and HF.

Per family with a generated package at ``--version``, named shape (costed on meta) and stage count K:
bottleneck / ideal of our plan (granularity chosen, values recomputed where cheaper than sent), of ours
before both, of the uniform layer split (optimum-graphcore), the parameter-balanced one (DeepSpeed), for
chains read off HF's pipeline plan torchtitan's and HF's native splits, the granularity bound and the
partitioner's time; default class and lengths, 8 sequences per micro-batch.  For T5 also the bytes per
cut before / after and the FLOP balance on FTPipe's shape; an LLM-only run: bench_partition_llm.py.

    python scripts/bench_partition.py [--docs docs] [--version 4.5.1] [--family F ...] [--shape S ...] [--stages 4,8]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, NotRequired, TypedDict, TypeVar

from common.atomic import write_atomic
from families.family import ModelFamily, definitions
from families.layout import generated_package
from partitioning.cost import granularity as grain
from partitioning.cost.chain import family_chain
from partitioning.cost.costing import Chain
from partitioning.plan import Plan
from partitioning.solve.baselines import hf_native_split, parameter_balanced_split, torchtitan_split, uniform_split
from partitioning.solve.partition import Settings, build_plan, partition
from partitioning.solve.plot import plot_ratios

STAGES = (2, 4, 8)
BATCH = 8
# One A100-class device: ~100 TFLOP/s sustained in bf16, NVLink-class ~300 GB/s to its neighbour.
SETTINGS = Settings(device_flops=100e12, bandwidth=300e9, micro_batches=8, schedule="1f1b")
CLI = replace(SETTINGS, bandwidth=25e9)  # partition-model's defaults
SECTION = "## Pipeline partitioning (`scripts/bench_partition.py`)"
# FTPipe's acyclic partitioner on generated t5-small, batch 4, 64 -> 32, FLOP node weights (docs/FACTS)
FTPIPE = {2: 1.001, 4: 1.009}
# Links so fast that sending costs nothing measurable (Settings refuses an infinite bandwidth: plans are JSON).
FREE_LINKS = 1e300


T = TypeVar("T")


class Row(TypedDict):
    """One line of the main table: a shape split into ``stages`` stages by each method."""

    shape: str
    stages: int
    blocks: int
    ours: float
    before: float
    granularity: Any  # as the plan's model records it
    uniform: float
    parameters: float
    bound: float
    partition_ms: float
    costing_s: float
    torchtitan: NotRequired[float]  # for chains read off HF's pipeline plan only
    hf: NotRequired[float]


def _best_of(repeats: int, run: Callable[[], T]) -> tuple[float, T]:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def ours(chain: Chain, layer_lists: tuple[str, ...], stages: int, settings: Settings) -> Plan:
    """partition-model's plan: granularity chosen automatically, recomputation on."""
    return grain.choose(chain, layer_lists, lambda c, g: partition(c.blocks, stages, settings,
                                                                    {"granularity": g}, c.values))[0]


def before(layers: Chain, stages: int, settings: Settings) -> Plan:
    """The plan before sub-layer blocks and recomputation: one block per layer, every value sent."""
    return partition(layers.blocks, stages, replace(settings, recompute=False), {}, layers.values)


def _llm_baselines(family: ModelFamily) -> bool:  # torchtitan's and HF's splits: chains read off HF's pp plan
    return family.definition.chain_from is not None


def measure(families: list[ModelFamily], shapes: set[str] | None, stage_counts: tuple[int, ...] = STAGES
            ) -> tuple[list[Row], list[str]]:
    """The table's rows, and one line per family saying what was measured."""
    rows: list[Row] = []
    setups: list[str] = []
    for family in families:
        class_name = family.definition.default_class
        micro_batch = family.micro_batch(BATCH)
        layer_lists = family.layer_lists(class_name)
        setups.append(f"{family.name}: {class_name}, micro-batch {micro_batch.describe()} tokens")
        for shape in family.definition.shapes:
            if shapes is not None and shape not in shapes:
                continue
            if shapes is None and shape == family.definition.verify_shape != family.definition.default_shape:
                continue  # the converter's tiny fx-check shape: nobody pipelines it
            config = family.config(shape)
            cost_seconds, chain = _best_of(1, partial(family_chain, family, class_name, config, micro_batch,
                                                        sublayers=True))
            layers = grain.layer_chain(chain, layer_lists)
            for stages in stage_counts:
                seconds, plan = _best_of(5, partial(ours, chain, layer_lists, stages, SETTINGS))
                more = {}
                if _llm_baselines(family):
                    more = {name: build_plan(layers.blocks, split(layers.blocks, stages, layer_lists), SETTINGS, {},
                                             values=layers.values)
                            for name, split in (("torchtitan", torchtitan_split), ("hf", hf_native_split))}
                uniform = build_plan(layers.blocks, uniform_split(layers.blocks, stages, layer_lists), SETTINGS, {},
                                     values=layers.values)
                balanced = build_plan(layers.blocks, parameter_balanced_split(layers.blocks, stages,
                                                                              layers.shared_bytes),
                                      SETTINGS, {}, values=layers.values)
                compute_only = partition(chain.blocks, stages, replace(SETTINGS, bandwidth=FREE_LINKS))
                if plan.bottleneck > min(uniform.bottleneck, balanced.bottleneck,
                                         *(other.bottleneck for other in more.values())):
                    raise SystemExit(f"{shape} K={stages}: the optimal plan lost to a baseline")
                row: Row = {"shape": shape, "stages": stages, "blocks": len(plan.blocks), "ours": plan.ratio,
                             "before": before(layers, stages, SETTINGS).ratio, "granularity": plan.model["granularity"],
                             "uniform": uniform.ratio, "parameters": balanced.ratio,
                             "bound": compute_only.bottleneck / plan.ideal,
                             "partition_ms": seconds * 1e3, "costing_s": cost_seconds}
                if more:
                    row["torchtitan"], row["hf"] = more["torchtitan"].ratio, more["hf"].ratio
                rows.append(row)
    return rows, setups


def table(rows: list[Row]) -> str:
    llm = any("torchtitan" in r for r in rows)
    extra = " torchtitan | HF native |" if llm else ""
    lines = ["| shape | K | blocks | ours | ours before | uniform (optimum-graphcore) | parameters (DeepSpeed) |"
             f"{extra} granularity bound | ours / bound | partition ms | costing s (meta) |",
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if llm else "")]
    for r in rows:
        others = "".join(f" {value:.3f} |" if value is not None else " - |"
                         for value in (r.get("torchtitan"), r.get("hf"))) if llm else ""
        lines.append(f"| {r['shape']} | {r['stages']} | {r['blocks']} | **{r['ours']:.3f}** | {r['before']:.3f} "
                     f"| {r['uniform']:.3f} | {r['parameters']:.3f} |{others} {r['bound']:.3f} "
                     f"| {r['ours'] / r['bound']:.3f} | {r['partition_ms']:.1f} | {r['costing_s']:.2f} |")
    return "\n".join(lines)


def _mb(size: float) -> str:
    return f"{size / 1e6:.2f}"


def crossing_table(family: ModelFamily, shapes: list[str], stages: int = 4) -> str:
    """Before / after at partition-model's defaults: bottleneck / ideal and the bytes over each cut."""
    class_name = family.definition.default_class
    layer_lists = family.layer_lists(class_name)
    micro_batch = family.micro_batch(BATCH)
    lines = [f"{family.name} {class_name}, micro-batch {micro_batch.describe()}, K = {stages}, "
             f"{CLI.device_flops / 1e12:.0f} TFLOP/s, {CLI.bandwidth / 1e9:.0f} GB/s (`partition-model` defaults):",
             "", "| shape | before: bottleneck / ideal | before: MB over each cut | after | after: MB over each cut "
             "| after: stages start at | recomputed (MB per micro-batch each) |", "|---|---|---|---|---|---|---|"]
    for shape in shapes:
        chain = family_chain(family, class_name, family.config(shape), micro_batch, sublayers=True)
        old = before(grain.layer_chain(chain, layer_lists), stages, CLI)
        new = ours(chain, layer_lists, stages, CLI)
        by_name = {v.name: v for v in new.values}
        shown = [by_name[n] for n in new.recomputed if any(by_name[n].key in s.recompute for s in new.stages)]
        lines.append(f"| {shape} | {old.ratio:.3f} | {' / '.join(_mb(s.send_bytes or 0) for s in old.stages[:-1])} "
                     f"| **{new.ratio:.3f}** | {' / '.join(_mb(s.send_bytes or 0) for s in new.stages[:-1])} "
                     f"| {', '.join(s.blocks[0] for s in new.stages[1:])} "
                     f"| {'; '.join(f'{v.key} ({_mb(v.bytes)})' for v in shown)} |")
    return "\n".join(lines)


def flop_table(family: ModelFamily, shape: str, batch: int, lengths: dict[str, int]) -> str:
    """FLOP max/mean over stages of each plan, and the bytes its cuts carry (FTPipe's measure)."""
    class_name = family.definition.default_class
    layer_lists = family.layer_lists(class_name)
    micro_batch = family.micro_batch(batch, lengths)
    chain = family_chain(family, class_name, family.config(shape), micro_batch, sublayers=True)
    layers = grain.layer_chain(chain, layer_lists)
    lines = [f"{family.name} {shape}, micro-batch {micro_batch.describe()}: forward FLOPs of the busiest stage over "
             f"the mean (FTPipe's acyclic partitioner, op-level, FLOP weights only: "
             f"{' / '.join(f'{v:.3f}' for v in FTPIPE.values())} at K = {' / '.join(map(str, FTPIPE))}), and the "
             f"bytes over all cuts per micro-batch:", "",
             "| K | plan | FLOP max / mean | bottleneck / ideal at 25 GB/s | MB over the cuts | stages start at |",
             "|---|---|---|---|---|---|"]
    def flops(plan: Plan) -> float:
        by_name = {b.name: b.flops for b in plan.blocks}
        per_stage = [sum(by_name[n] for n in s.blocks) for s in plan.stages]
        return max(per_stage) / (sum(per_stage) / len(per_stage))
    for stages in FTPIPE:
        candidates = [("before (layers, all sent), 25 GB/s", before(layers, stages, CLI)),
                      ("ours, 25 GB/s", ours(chain, layer_lists, stages, CLI)),
                      ("ours, 300 GB/s", ours(chain, layer_lists, stages, SETTINGS)),
                      ("sub-layer FLOP optimum (links free)", ours(chain, layer_lists, stages,
                                                                  replace(CLI, bandwidth=FREE_LINKS)))]
        for name, plan in candidates:
            index = {block.name: i for i, block in enumerate(plan.blocks)}
            segments = [(index[s.blocks[0]], index[s.blocks[-1]]) for s in plan.stages]
            costed = build_plan(plan.blocks, segments, CLI, {}, values=plan.values)  # the same split at 25 GB/s
            lines.append(f"| {stages} | {name} | {flops(plan):.3f} | {costed.ratio:.3f} "
                         f"| {_mb(sum(s.send_bytes or 0 for s in costed.stages))} "
                         f"| {', '.join(s.blocks[0] for s in plan.stages[1:])} |")
    return "\n".join(lines)


def section(rows: list[Row], setups: list[str], png: str, extra: str, load: float,
            heading: str = SECTION) -> str:
    models = "; ".join(setups)
    return f"""{heading}

Bottleneck / ideal (lower is better; 1.0 is a perfect balance of compute) for
{models};
{SETTINGS.micro_batches} micro-batches under 1F1B, {SETTINGS.device_flops / 1e12:.0f} TFLOP/s per device,
{SETTINGS.bandwidth / 1e9:.0f} GB/s between stages, no memory limit.  A stage costs forward + backward
(3x the forward FLOPs counted by `FlopCounterMode`), plus recomputing the values it recomputes
instead of receiving them, plus sending the tensors live across its outgoing cut that are not
recomputed.  *Ours* chooses the block granularity (one block per layer, or per sub-layer) and
recomputes what is cheaper to recompute; *ours before* is one block per layer with everything
sent, as before issue 12; the baselines split whole layers (and recompute like ours: the
comparison is of the split).  *Ideal* is total compute / K; the *granularity bound* is the best
compute-only bottleneck any contiguous split of the sub-layer blocks reaches (over the ideal).
Costing runs once per shape on the `meta` device; *partition ms* is our whole planning (both
granularities) without costing (best of 5).  The run started at load average {load:.1f} on this
machine's {os.cpu_count()} cores: the two time columns are wall times under that load, while every
ratio is computed from FLOP and byte counts and does not depend on it.

{table(rows)}

{summary(rows)}
{f"{chr(10)}![bottleneck / ideal per method]({png}){chr(10)}" if png else ""}{extra}"""


def summary(rows: list[Row]) -> str:
    near_ideal = sum(r["ours"] <= 1.05 for r in rows)
    allowed = sum(r["bound"] <= 1.05 for r in rows)
    worst = max(r["ours"] / r["bound"] for r in rows)
    improved = sum(r["ours"] < r["before"] for r in rows)
    if any(r["ours"] > r["before"] for r in rows):
        raise SystemExit("a plan got worse than before sub-layer blocks and recomputation")
    return (f"Ours is within 1.05 of ideal in {near_ideal} of the {allowed} cases whose granularity bound allows "
            f"it ({len(rows)} cases in all), at most {worst:.3f} x the granularity bound, never worse than "
            f"either baseline or than before (better in {improved} cases; the script checks).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=Path, default=Path("docs"), help="where the report goes (default: docs)")
    parser.add_argument("--version", default="4.5.1", help="the transformers release of the generated models")
    parser.add_argument("--family", action="append", help="only these families (default: every one)")
    parser.add_argument("--shape", action="append", help="only these named shapes (default: every one)")
    parser.add_argument("--stages", type=lambda text: tuple(int(k) for k in text.split(",")), default=STAGES,
                        help="stage counts, comma-separated (default: 2,4,8)")
    args = parser.parse_args(argv)
    names = args.family or sorted(n for n in definitions() if importlib.util.find_spec(generated_package(n, args.version)))
    families = [ModelFamily.load(name, args.version) for name in names]
    load = os.getloadavg()[0]
    rows, setups = measure(families, set(args.shape) if args.shape else None, args.stages)
    if families and all(_llm_baselines(family) for family in families):
        from bench_partition_llm import llm_section  # the LLMs' section (scripts/ is this script's path)
        _replace_section(args.docs / "benchmarks.md", *llm_section(args, families, rows, setups, load))
        return 0
    extra = ""
    if "t5" in [family.name for family in families]:
        t5 = next(family for family in families if family.name == "t5")
        extra = (f"\n### Recompute instead of send: bytes over each cut\n\n"
                 f"{crossing_table(t5, ['t5-small', 't5-base', 't5-large'])}\n\n"
                 f"### FLOP balance (FTPipe's measure)\n\n"
                 f"{flop_table(t5, 't5-small', 4, {'source': 64, 'target': 32})}\n")
    text = section(rows, setups, "bench_partition.png", extra, load)
    print(table(rows))
    plot_ratios([(f"{r['shape']} K={r['stages']}", {"ours": r["ours"], "ours before": r["before"],
                                                     "uniform": r["uniform"], "parameters": r["parameters"]})
                 for r in rows],
                args.docs / "bench_partition.png", "Pipeline split: bottleneck / ideal")
    write_atomic(args.docs / "bench_partition.md", (text.replace(SECTION, "# Pipeline partitioning", 1)).encode())
    _replace_section(args.docs / "benchmarks.md", SECTION, text)
    return 0


def _replace_section(benchmarks: Path, heading: str, text: str) -> None:
    """Re-running replaces this section and keeps everything else."""
    existing = benchmarks.read_text() if benchmarks.exists() else "# Benchmarks\n"
    kept = existing.split(heading)[0].rstrip("\n") + "\n"
    rest = existing.split(heading, 1)[1] if heading in existing else ""
    after = rest[rest.find("\n## "):] if "\n## " in rest else ""
    write_atomic(benchmarks, (kept + "\n" + text + after).encode())


if __name__ == "__main__":
    sys.exit(main())
