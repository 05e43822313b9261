"""The exact split of a chain into contiguous segments (the DP every solver runs), and the plan of a given split.

:func:`min_max_split` minimizes the segment costs sorted from the largest down, lexicographically (see
:mod:`partitioning.solve.partition` for what that buys); the one-stage-per-rank solver
(:mod:`partitioning.solve.single`), the several-chunks search (:mod:`partitioning.solve.chunks`), the baselines
and the IPU target run it.  :func:`build_plan` costs a given split under a schedule's settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from common.errors import UserError
from partitioning.plan import Block, Plan, Stage, Value
from partitioning.settings import Settings
from partitioning.solve.costs import ChainCosts

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
