"""Exact optimal contiguous split of a block chain into pipeline stages.

A stage costs, per micro-batch, its forward + backward compute plus the time
to send the tensors crossing its outgoing cut, plus the time to recompute the
values it chooses to recompute rather than receive
(:mod:`partitioning.solve.costs`).  The split minimizes the bottleneck (the
most expensive stage), subject to a per-device memory limit.  Because the
recompute-or-send choice is made per value, not per split, it can move time
onto a stage that becomes the bottleneck: the partitioner also plans with
every value sent and keeps that plan when its bottleneck is strictly lower.
Ties are broken exactly: among splits with the same bottleneck, the least
total bytes over the cuts, then the lexicographically smallest stage ends.
Every comparison is between floats computed the same way from exact segment
sums (``math.fsum`` is correctly rounded), so no epsilon is involved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from common.errors import UserError
from partitioning.plan import Block, Plan, Stage, Value
from partitioning.solve.chunks import finish, plan_chunks, predict
from partitioning.solve.costs import SCHEDULES, ChainCosts, Settings, choose_recomputed, recompute_seconds
from partitioning.solve.schedules import AUTO, SINGLE

__all__ = ["SCHEDULES", "ChainCosts", "Segment", "Settings", "build_plan", "check_stage_count", "choose_recomputed",
           "min_max_split", "partition", "recompute_seconds", "size"]

Segment = tuple[int, int]  # first and last block index, inclusive


def check_stage_count(blocks: int, stages: int) -> None:
    if stages < 1:
        raise UserError(f"the number of stages must be at least 1, got {stages}")
    if stages > blocks:
        raise UserError(f"cannot split {blocks} blocks into {stages} stages (at most {blocks} at this granularity)")


def min_max_split(n: int, k: int, cost: Callable[[int, int, int], float],
                  allowed: Callable[[int, int, int], bool] = lambda s, i, j: True,
                  cut_weight: Callable[[int], int] = lambda j: 0) -> list[Segment] | None:
    """Split ``n`` items into ``k`` non-empty contiguous segments minimizing the largest ``cost(stage, i, j)``.

    Only segments with ``allowed(stage, i, j)`` are used.  Ties: least total
    ``cut_weight`` over the cuts, then the lexicographically smallest segment
    ends.  None when no split is allowed.  O(k * n^2) cost evaluations.
    """
    check_stage_count(n, k)
    inf = math.inf
    # best[s][i]: smallest bottleneck for items i.. in stages s..k-1 (suffix form, so the
    # stage index, which the memory of a stage depends on, is known at every step).
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    best[k][n] = -inf
    for s in range(k - 1, -1, -1):
        for i in range(s, n - (k - s) + 1):
            for j in range(i, n - (k - s - 1)):
                if best[s + 1][j + 1] < inf and allowed(s, i, j):
                    best[s][i] = min(best[s][i], max(cost(s, i, j), best[s + 1][j + 1]))
    bottleneck = best[0][0]
    if bottleneck == inf:
        return None
    # Among splits whose every stage costs <= bottleneck, least total cut weight.
    weight: list[list[float]] = [[inf] * (n + 1) for _ in range(k + 1)]
    weight[k][n] = 0
    for s in range(k - 1, -1, -1):
        for i in range(s, n - (k - s) + 1):
            for j in range(i, n - (k - s - 1)):
                if weight[s + 1][j + 1] < inf and allowed(s, i, j) and cost(s, i, j) <= bottleneck:
                    cut = cut_weight(j) if s < k - 1 else 0
                    weight[s][i] = min(weight[s][i], cut + weight[s + 1][j + 1])
    segments, i = [], 0
    for s in range(k):
        for j in range(i, n - (k - s - 1)):  # the first (smallest) end that stays optimal
            cut = cut_weight(j) if s < k - 1 else 0
            if (allowed(s, i, j) and cost(s, i, j) <= bottleneck and weight[s + 1][j + 1] < inf
                    and cut + weight[s + 1][j + 1] == weight[s][i]):
                segments.append((i, j))
                i = j + 1
                break
    return segments


def build_plan(blocks: Sequence[Block], segments: Sequence[Segment], settings: Settings,
               model: dict[str, Any], costs: ChainCosts | None = None, method: str = "optimal",
               values: Sequence[Value] = ()) -> Plan:
    """The plan of a given split, costed under ``settings`` (memory is reported, not enforced)."""
    costs = costs or ChainCosts(blocks, settings, model.get("shared_bytes"), values)
    k = len(segments)
    stages = [Stage(index=s, blocks=tuple(b.name for b in blocks[i:j + 1]), compute=costs.compute(i, j),
                    communication=costs.communication(j), memory_bytes=round(costs.memory(s, k, i, j)),
                    recompute=tuple(dict.fromkeys(v.key for v in costs.recomputing(i, j))),
                    recompute_time=costs.recompute_time(i, j), send_bytes=costs.cut_bytes(j))
              for s, (i, j) in enumerate(segments)]
    return Plan(model=dict(model), blocks=list(blocks), stages=stages,
                settings={**settings.to_dict(), "stages": k, "method": method}, values=list(costs.values),
                recomputed=[v.name for v in costs.values if v.name in costs.recomputed])


def partition(blocks: Sequence[Block], stages: int, settings: Settings, model: dict[str, Any] | None = None,
              values: Sequence[Value] = ()) -> Plan:
    """The optimal plan for the schedule: for one stage per rank, the least bottleneck over all contiguous
    splits that fit the memory limit (then simulated); for several, :mod:`partitioning.solve.chunks`; for
    ``auto``, :mod:`partitioning.solve.auto`."""
    if settings.schedule == AUTO:
        from partitioning.solve.auto import choose  # it plans every schedule through this function

        return choose(blocks, stages, settings, model or {}, values)
    if settings.schedule not in SINGLE:
        return plan_chunks(blocks, stages, settings, model or {}, values)[0]
    check_stage_count(len(blocks), stages)
    costs = ChainCosts(blocks, settings, (model or {}).get("shared_bytes"), values)
    plan = _optimal(blocks, stages, costs, model or {})
    if costs.recomputed:
        sent = ChainCosts(blocks, replace(settings, recompute=False), (model or {}).get("shared_bytes"), values)
        other = _optimal(blocks, stages, sent, model or {})
        if other is not None and (plan is None or other.bottleneck < plan.bottleneck):
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
