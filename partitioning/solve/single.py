"""The optimal plan of a schedule running one stage per rank (GPipe, 1F1B): the exact split, then simulated."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from common.errors import UserError
from partitioning.plan import Block, Plan, Value
from partitioning.settings import Settings
from partitioning.solve.chunks import finish, predict
from partitioning.solve.costs import ChainCosts
from partitioning.solve.split import build_plan, check_stage_count, min_max_split


def plan_single(blocks: Sequence[Block], stages: int, settings: Settings, model: dict[str, Any] | None = None,
                values: Sequence[Value] = ()) -> Plan:
    """The optimal plan of a one-stage-per-rank schedule: the least sorted stage costs over all contiguous splits
    that fit the memory limit, planned with the recompute choices and with every value sent (the better kept),
    then simulated."""
    check_stage_count(len(blocks), stages)
    costs = ChainCosts(blocks, settings, (model or {}).get("shared_bytes"), values)
    plan = _optimal(blocks, stages, costs, model or {})
    if costs.recomputed:
        sent = ChainCosts(blocks, replace(settings, recompute=False), (model or {}).get("shared_bytes"), values)
        other = _optimal(blocks, stages, sent, model or {})
        if other is not None and (plan is None or other.loads < plan.loads):
            plan, costs = other, sent
    if plan is None and settings.memory_limit is None or plan is not None and not math.isfinite(plan.bottleneck):
        raise UserError(f"the stage times overflow (device {settings.device_flops:.3g} FLOP/s, link "
                        f"{settings.bandwidth:.3g} B/s, memory {settings.memory_bandwidth:.3g} B/s): "
                        f"give realistic --device-flops, --bandwidth and --memory-bandwidth")
    if plan is None:
        raise UserError(_memory_diagnosis(blocks, stages, costs))
    segments, start = [], 0
    for stage in plan.stages:
        segments.append((start, start + len(stage.blocks) - 1))
        start += len(stage.blocks)
    return finish(plan, predict(costs, segments, stages), stages)


def _optimal(blocks: Sequence[Block], stages: int, costs: ChainCosts, model: dict[str, Any]) -> Plan | None:
    """The optimal split under ``costs``, or None when none fits the memory limit."""
    segments = min_max_split(len(blocks), stages, lambda s, i, j: costs.cost(i, j),
                             lambda s, i, j: costs.fits(s, stages, i, j), costs.cut_bytes)
    return None if segments is None else build_plan(blocks, segments, costs.settings, model, costs)


def _memory_diagnosis(blocks: Sequence[Block], stages: int, costs: ChainCosts) -> str:
    """Name the stage that the least-overflowing split still puts over the limit, and by how much."""
    limit = costs.settings.memory_limit
    assert limit is not None  # without a limit every split fits
    segments = min_max_split(len(blocks), stages, lambda s, i, j: costs.memory(s, stages, i, j) - limit)
    assert segments is not None
    worst = max(range(stages), key=lambda s: costs.memory(s, stages, *segments[s]) - limit)
    i, j = segments[worst]
    need = costs.memory(worst, stages, i, j)
    where = f"block {blocks[i].name!r} alone" if i == j else f"blocks {blocks[i].name}..{blocks[j].name}"
    return (f"no split into {stages} stages fits {size(limit)} per device: at best, stage {worst} "
            f"({where}) needs {size(need)}, {size(need - limit)} over")


def size(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if abs(value) >= scale:
            return f"{value / scale:.3f} {unit}"
    return f"{value:.0f} B"
