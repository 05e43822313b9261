"""Exact optimal contiguous split of a block chain into pipeline stages.

A stage costs, per micro-batch, its forward + backward compute plus the time
to send the tensors crossing its outgoing cut, plus the time to recompute the
values it chooses to recompute rather than receive
(:mod:`partitioning.solve.costs`).  The split minimizes the stage costs
sorted from the largest down, lexicographically: the bottleneck (the most
expensive stage) first, then among splits with that bottleneck the
next-busiest stage, and so on, subject to a per-device memory limit.  So a
stage the bottleneck leaves room for gets work (where an LM head alone sets
the bottleneck, the layers spread over the other stages instead of leaving
one with nothing but a norm).  Because the
recompute-or-send choice is made per value, not per split, it can move time
onto a stage that becomes the bottleneck: the partitioner also plans with
every value sent and keeps that plan when its sorted costs are lower.
Remaining ties are broken exactly: the least total bytes over the cuts, then
the lexicographically smallest stage ends.  Every comparison is between
stage costs, each computed the same way from exact segment sums
(``math.fsum`` is correctly rounded) whatever split it is part of, and none
is added to another: two bottlenecks are equal when they are the same float,
and no epsilon is involved.
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
                  cut_weight: Callable[[int], int] = lambda j: 0, spread: bool = True) -> list[Segment] | None:
    """Split ``n`` items into ``k`` non-empty contiguous segments with the least largest ``cost(stage, i, j)``.

    With ``spread``, among those the least sorted costs: the costs of a split, from the largest down, compared
    lexicographically (the bottleneck, then the second-largest cost, and so on), so work moves off the busiest
    segments onto the idle ones wherever the bottleneck allows; without it (a placement that follows published
    layouts) any split within the bottleneck.  Only segments with ``allowed(stage, i, j)`` are used.  Ties:
    least total ``cut_weight`` over the cuts, then the lexicographically smallest segment ends.  None when no
    split is allowed.  O(k * n^2) cost evaluations, with ``spread`` each merged into at most k sorted costs.
    """
    check_stage_count(n, k)
    inf = math.inf
    # least[s][i]: smallest bottleneck for items i.. in stages s..k-1 (suffix form, so the stage index, which the
    # memory of a stage depends on, is known at every step).
    least = [[inf] * (n + 1) for _ in range(k + 1)]
    least[k][n] = -inf
    for s in range(k - 1, -1, -1):
        for i in range(s, n - (k - s) + 1):
            for j in range(i, n - (k - s - 1)):
                if least[s + 1][j + 1] < inf and allowed(s, i, j):
                    least[s][i] = min(least[s][i], max(cost(s, i, j), least[s + 1][j + 1]))
    bottleneck = least[0][0]
    if bottleneck == inf:
        return None
    # Among splits whose every segment costs <= bottleneck, best[s][i]: the least (costs sorted descending, or
    # none without spread; cut weight) of the suffix, None if there is none; end[s][i]: the smallest end of
    # stage s reaching it.  Adding one cost to two sorted vectors keeps their strict order, so a split is
    # optimal exactly when every suffix of it is: the DP and the walk are exact.
    best: list[list[tuple[tuple[float, ...], int] | None]] = [[None] * (n + 1) for _ in range(k + 1)]
    best[k][n] = ((), 0)
    end = [[-1] * (n + 1) for _ in range(k)]
    for s in range(k - 1, -1, -1):
        for i in range(s, n - (k - s) + 1):
            for j in range(i, n - (k - s - 1)):
                rest = best[s + 1][j + 1]
                if rest is None or not allowed(s, i, j) or (here := cost(s, i, j)) > bottleneck:
                    continue
                key = (_merged(here, rest[0]) if spread else (), rest[1] + (cut_weight(j) if s < k - 1 else 0))
                current = best[s][i]
                if current is None or key < current:  # strictly: the smallest end is kept on a tie
                    best[s][i], end[s][i] = key, j
    segments, i = [], 0
    for s in range(k):
        segments.append((i, end[s][i]))
        i = end[s][i] + 1
    return segments


def _merged(cost: float, costs: tuple[float, ...]) -> tuple[float, ...]:
    """``costs`` (sorted from the largest down) with ``cost`` added in its place."""
    at = next((index for index, other in enumerate(costs) if other < cost), len(costs))
    return (*costs[:at], cost, *costs[at:])


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
