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

from collections.abc import Sequence
from typing import Any

from partitioning.plan import Block, Plan, Value
from partitioning.schedules import AUTO, SCHEDULES, SINGLE
from partitioning.settings import Settings
from partitioning.solve.auto import choose
from partitioning.solve.chunks import plan_chunks
from partitioning.solve.costs import ChainCosts, choose_recomputed, recompute_seconds
from partitioning.solve.single import plan_single, size
from partitioning.solve.split import Segment, build_plan, check_stage_count, min_max_split

__all__ = ["SCHEDULES", "ChainCosts", "Segment", "Settings", "build_plan", "check_stage_count", "choose_recomputed",
           "min_max_split", "partition", "recompute_seconds", "size"]


def partition(blocks: Sequence[Block], stages: int, settings: Settings, model: dict[str, Any] | None = None,
              values: Sequence[Value] = ()) -> Plan:
    """The optimal plan for the schedule: for one stage per rank, :mod:`partitioning.solve.single`; for several,
    :mod:`partitioning.solve.chunks`; for ``auto``, :mod:`partitioning.solve.auto` (which plans every schedule)."""
    if settings.schedule == AUTO:
        return choose(blocks, stages, settings, model or {}, values)
    if settings.schedule not in SINGLE:
        return plan_chunks(blocks, stages, settings, model or {}, values)[0]
    return plan_single(blocks, stages, settings, model, values)
