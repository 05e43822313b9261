"""PNG pictures of plans (matplotlib, headless)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from common.atomic import write_atomic
from common.errors import UserError
from partitioning.plan import Plan


def _pyplot() -> ModuleType:
    try:
        import matplotlib
    except ImportError:
        raise UserError("plotting needs matplotlib (pip install 'hf-pipeline-convert[plot]')") from None
    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def plan_png(plan: Plan) -> bytes:
    """Per-stage compute and communication time against the ideal, and memory against the limit, as a PNG."""
    plt = _pyplot()
    figure, (times, memory) = plt.subplots(1, 2, figsize=(11, 4))
    stages = [stage.index for stage in plan.stages]
    compute = [stage.compute * 1e3 for stage in plan.stages]
    recompute = [stage.recompute_time * 1e3 for stage in plan.stages]
    communication = [stage.communication * 1e3 for stage in plan.stages]
    times.bar(stages, compute, label="compute (fwd+bwd)")
    times.bar(stages, recompute, bottom=compute, label="recompute")
    times.bar(stages, communication, bottom=[c + r for c, r in zip(compute, recompute)], label="send")
    times.axhline(plan.ideal * 1e3, color="black", linestyle="--", label="ideal")
    times.set(xlabel="stage", ylabel="ms per micro-batch", xticks=stages,
              title=f"bottleneck / ideal = {plan.ratio:.3f}")
    times.legend()
    memory.bar(stages, [stage.memory_bytes / 1e9 for stage in plan.stages], color="tab:green")
    limit = plan.settings.get("memory_limit")
    if limit:
        memory.axhline(limit / 1e9, color="red", linestyle="--", label="limit")
        memory.legend()
    memory.set(xlabel="stage", ylabel="GB per device", xticks=stages, title="memory")
    return _png(plt, figure)


def plot_ratios(rows: Sequence[tuple[str, dict[str, float]]], path: Path, title: str) -> None:
    """Grouped bars: for each case (e.g. ``t5-base K=4``) the bottleneck / ideal of each method."""
    plt = _pyplot()
    methods = list(rows[0][1]) if rows else []
    figure, axes = plt.subplots(figsize=(max(6, len(rows) * 0.9), 4))
    width = 0.8 / max(len(methods), 1)
    for m, method in enumerate(methods):
        axes.bar([r + m * width for r in range(len(rows))], [values[method] for _, values in rows], width,
                 label=method)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.set_xticks([r + width * (len(methods) - 1) / 2 for r in range(len(rows))])
    axes.set_xticklabels([case for case, _ in rows], rotation=45, ha="right")
    axes.set(ylabel="bottleneck / ideal (lower is better)", title=title)
    axes.legend()
    write_atomic(path, _png(plt, figure))


def _png(plt: ModuleType, figure: Any) -> bytes:
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()
