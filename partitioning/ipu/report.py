"""The table ``partition-model --target ipu`` prints: the placement's pipeline stages, memory and timing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from partitioning.ipu.memory import TERM_COLUMNS
from partitioning.ipu.placement import Placement
from partitioning.ipu.section import PublishedLayout


def _table(rows: Sequence[tuple[str, ...]], left: int) -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) if c >= left else cell.rjust(width)
                      for c, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in rows]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"


def _mb(size: float) -> str:
    return f"{size / 1e6:.1f}"


def format_placement(placement: Placement, published: PublishedLayout | None = None) -> str:
    config, model = placement.config, placement.plan.model
    what = " ".join(str(model[key]) for key in ("family", "version", "class") if key in model)
    form = f" ({placement.roles.form} form)" if placement.roles else ""
    total = placement.ipus * config.replication_factor
    mode = (f"training, gradient accumulation {config.gradient_accumulation} (>= 2N-1)" if config.training
            else f"inference ({config.inference_execution}), device iterations {config.device_iterations}")
    lines = [f"IPU placement of {what}{form}: {placement.ipus} IPUs x {config.replication_factor} replicas = "
             f"{total} IPUs; {mode}",
             f"pipeline: N = {placement.pipeline_stages} stages (AutoStage.AutoIncrement) for "
             f"{len(placement.stages)} plan stages"
             + (", re-split so the shared weight's IPU also carries its later users" if placement.rebalanced else "")]
    stage_of = {user_id: stage.index for stage in placement.pipeline() for user_id in stage.user_ids}
    members: dict[int, list[str]] = {}
    for unit, annotation in zip(placement.units, placement.in_effect()):
        if annotation is not None:
            members.setdefault(stage_of[annotation.user_id], []).append(unit.name)
    why: dict[int, str] = {}
    for annotation in placement.annotations:  # a merged pipeline stage is explained by its first block
        why.setdefault(stage_of[annotation.user_id], annotation.why)
    rows: list[tuple[str, ...]] = [("pipeline stage", "IPU", "blocks", "starts because")]
    for stage in placement.pipeline():
        names = members[stage.index]  # a stage exists because a block starts in it
        blocks = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})"
        rows.append((str(stage.index), str(stage.ipu), blocks, why.get(stage.index, "")))
    lines += _table(rows, left=2)
    precision = "float16" if config.half_precision else "float32"
    optimizer = ("off chip" if config.optimizer_state_offchip else
                 "sharded over replicas" if config.replicated_tensor_sharding and config.replication_factor > 1
                 else "on chip")
    lines.append(f"memory (MB) for micro-batch {_micro_batch(model)}, {precision} weights and activations, optimizer "
                 f"state {optimizer}, {len(placement.memory.checkpoints)} recomputation checkpoints, projection "
                 f"serialized x{config.embedding_serialization_factor}:")
    terms = list(TERM_COLUMNS)
    rows = [("IPU", "compute ms", "stage ms", *TERM_COLUMNS.values(), "total", "of")]
    for cost in placement.ipu_costs():
        rows.append((str(cost.ipu), _ms(cost.compute), _ms(cost.stage_compute),
                     *(_mb(getattr(cost.memory, t)) for t in terms), _mb(cost.memory_bytes), _mb(cost.budget_bytes)))
    lines += _table(rows, left=len(rows[0]))
    planned = max(stage.compute for stage in placement.plan.stages)
    lines.append(f"busiest IPU {_ms(placement.bottleneck)} ms per micro-batch (the plan's busiest stage: "
                 f"{_ms(planned)} ms); predicted step {_ms(placement.step_seconds)} ms")
    layout = f"layers_per_ipu {placement.layers_per_ipu()}"
    if published is not None and published.ipus == placement.ipus:
        layout += f"; published for {published.shape}: {list(published.layers_per_ipu)} ({published.source})"
    lines.append(layout)
    return "\n".join(lines)


def _micro_batch(model: dict[str, Any]) -> str:
    micro_batch = model.get("micro_batch")
    if not isinstance(micro_batch, dict):
        return "as planned"
    lengths = micro_batch.get("lengths")
    sizes = ", ".join(f"{k} {v}" for k, v in lengths.items()) if isinstance(lengths, dict) else "?"
    return f"{micro_batch.get('batch', '?')} x {sizes}"
