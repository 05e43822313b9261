"""Splits for a schedule: the chain in K x V chunks placed as the schedule places them, costed by simulation.

A schedule running V chunks per rank (:mod:`partitioning.schedules`)
does not have the one-stage-per-rank bottleneck as its step time: a rank's
load is the sum of its chunks, placed in a loop (chunk ``j`` on rank
``j mod K``) or a V (rank ``r`` holds chunks ``r`` and ``2K - 1 - r``), and
the order of its actions leaves bubbles that depend on where the cuts are.
No exact DP applies, so the split is searched with the simulated step time
(:mod:`partitioning.solve.simulate`) as its cost: from the exact min-max
split into K x V chunks, a cut moves by one block while the step time drops
(a local search: it can stop at a local optimum).  Every rank must fit the
memory limit: its chunks' parameter state plus its simulated activation
peak.  Ties: the least bytes over the cuts, then the smallest chunk ends.

With the runtime's own terms (a calibration's, :mod:`partitioning.cost.runtime`)
every action costs the engine's overhead, every message its latency, and
after the last action each rank syncs its tied weights' gradients and steps
its optimizer (:func:`after_last_action`): the step time is the simulated
pipeline plus the slowest rank's tail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from common.errors import UserError
from partitioning.plan import Block, Plan, Value
from partitioning.schedules import SINGLE, chain_streams, check_runs, orders, placement, streams
from partitioning.settings import Settings
from partitioning.solve.costs import ChainCosts
from partitioning.solve.simulate import ChunkCost, Timeline, simulate
from partitioning.solve.split import build_plan, min_max_split

Segment = tuple[int, int]


@dataclass(frozen=True)
class Prediction:
    """A split under a schedule, simulated."""

    segments: tuple[Segment, ...]
    timeline: Timeline
    rank_memory: tuple[float, ...]  # bytes: parameter state of the rank's chunks + its activation peak
    fits: bool
    tied_sync: tuple[float, ...] = ()  # per rank: seconds summing tied weights' gradients after the pipeline
    update: tuple[float, ...] = ()  # per rank: seconds of the optimizer step

    @property
    def step_time(self) -> float:
        tails = [tied + update for tied, update in zip(self.tied_sync, self.update)]
        return self.timeline.step_time + max(tails, default=0.0)

    def to_dict(self) -> dict[str, Any]:
        found = {"step_time": self.step_time, "bubble": self.timeline.bubble, "rank_busy": list(self.timeline.busy),
                 "rank_memory_bytes": [round(memory) for memory in self.rank_memory]}
        if self.tied_sync:
            found.update(pipeline_time=self.timeline.step_time, rank_tied_sync=list(self.tied_sync),
                         rank_update=list(self.update))
        return found


def chunk_costs(costs: ChainCosts, segments: Sequence[Segment]) -> list[ChunkCost]:
    """Per chunk: forward (with its recomputations), backward, its weight-gradient part, send, activations."""
    chunks = []
    settings = costs.settings
    for i, j in segments:
        forward = costs.forward(i, j)
        backward = costs.compute(i, j) - forward
        latency = settings.latency if j < len(costs.blocks) - 1 else 0.0
        chunks.append(ChunkCost(forward + costs.recompute_time(i, j), backward,
                                backward * settings.weight_gradient, costs.communication(j) + latency,
                                costs.activations(i, j), settings.action_overhead))
    return chunks


def after_last_action(costs: ChainCosts, segments: Sequence[Segment], where: Sequence[int],
                      ranks: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per rank, the seconds of the tied-gradient sum and of the optimizer step (0 without runtime terms).

    The tied sum is the one ``settings.tied_sum`` names, as the runtime runs it
    (:meth:`partitioning.gpu.pipelining.PipelineRun.sync_tied_gradients`).

    ``ordered`` (:func:`partitioning.gpu.tied.ordered_sum`): per micro-batch its partial sum walks the weight's
    uses from the last back: each use but the walk's first is one addition where it is held (reading two
    tensors of the weight's size ``S``, writing one), each change of rank along the walk one message of ``S``
    (the latency, ``S`` over the link) that the receiving rank waits for, and the rank of the first use adds
    the sum to the running total.  So a rank pays ``m`` times its additions and received messages (the sender
    does not wait: the micro-batches' walks overlap), then every holder the total's broadcast (``H - 1`` sends
    of ``S``), the two small all-gathers of use counts (two latencies), the division by the micro-batch count
    and the copy into each of the rank's other copies (a read and a write of ``S`` each, at the memory
    bandwidth, which counts both).  Under the schedules that stream it (:func:`schedules.streams` for one
    replica, and a weight whose chain crosses each link once: :func:`schedules.chain_streams`) the walks run
    during the schedule (:mod:`partitioning.gpu.tied_stream`), each message sent before its receiver's backward
    of that micro-batch could start: the additions still cost the rank, the messages no wait, and no counts
    are gathered (one latency, the broadcast's).  A data-parallel run walks after the schedule instead.

    ``allreduce``: once a step each holder adds its ``c`` copies' accumulated gradients (``c - 1`` additions
    into a new tensor), all-reduces that over the ``H`` holders (a ring: ``2 (H - 1) / H`` of ``S`` sent and
    received, ``2 (H - 1)`` latencies) and copies the total into its copies (``c`` copies where it added, none
    where the one copy's gradient is the total).  A data-parallel run's division by the replica count is not in
    the plan (the replica count is the run's).
    """
    settings = costs.settings
    if not settings.runtime_terms:
        return (), ()
    rank_of_block = {block: rank for (i, j), rank in zip(segments, where) for block in range(i, j + 1)}
    tied, m = [0.0] * ranks, settings.micro_batches
    streaming = settings.tied_sum == "ordered" and streams(settings.schedule, ranks, len(where) // ranks, m, 1)
    for size, users in costs.tied_weights():
        chunks = {c for c, (i, j) in enumerate(segments) if any(i <= u <= j for u in users)}
        if len(chunks) < 2:
            continue  # one chunk holds it: no copies to sum
        walk = [rank_of_block[u] for u in sorted(users, reverse=True)]  # the uses' ranks, last use first
        additions, received = [0] * ranks, [0] * ranks
        for before, rank in zip(walk, walk[1:]):
            additions[rank] += 1
            received[rank] += rank != before
        additions[walk[-1]] += 1  # the micro-batch's sum into the running total
        holders = set(walk)
        if settings.tied_sum == "allreduce":
            ring = 2 * (len(holders) - 1) * (size / len(holders) / settings.bandwidth + settings.latency)
            for r in holders:
                copies = sum(1 for c in chunks if where[c] == r)
                tied[r] += ((copies - 1) * 3 + (copies > 1) * copies * 2) * size / settings.memory_bandwidth + ring
            continue
        message = size / settings.bandwidth + settings.latency
        streamed = streaming and chain_streams(sorted(chunks), where)
        for r in holders:
            copies = sum(1 for c in chunks if where[c] == r)  # a rank's other copies get the sum copied
            waits = 0.0 if streamed else received[r] * message
            tied[r] += m * (3 * additions[r] * size / settings.memory_bandwidth + waits)
            tied[r] += (len(holders) - 1) * size / settings.bandwidth + (1 if streamed else 3) * settings.latency
            tied[r] += 2 * copies * size / settings.memory_bandwidth
    params = [0.0] * ranks
    for (i, j), rank in zip(segments, where):
        params[rank] += costs.state_memory(i, j) / settings.state_copies
    return tuple(tied), tuple(p * settings.update_rate for p in params)


def predict(costs: ChainCosts, segments: Sequence[Segment], ranks: int) -> Prediction:
    """Simulate ``segments`` under ``costs.settings``' schedule on ``ranks`` ranks."""
    settings = costs.settings
    virtual = settings.virtual_stages or 1
    where = placement(settings.schedule, ranks, virtual)
    timeline = simulate(orders(settings.schedule, ranks, virtual, settings.micro_batches), where,
                        chunk_costs(costs, segments))
    memory = [0.0] * ranks
    for (i, j), rank in zip(segments, where):
        memory[rank] += costs.state_memory(i, j)
    rank_memory = tuple(state + peak for state, peak in zip(memory, timeline.peak_activations))
    limit = settings.memory_limit
    tied, update = after_last_action(costs, segments, where, ranks)
    return Prediction(tuple(segments), timeline, rank_memory, limit is None or max(rank_memory) <= limit, tied, update)


def _key(prediction: Prediction, costs: ChainCosts) -> tuple[Any, ...]:
    limit = costs.settings.memory_limit or 0.0
    over = 0.0 if prediction.fits else max(prediction.rank_memory) - limit
    cut_bytes = sum(costs.cut_bytes(j) for _, j in prediction.segments[:-1])
    return (not prediction.fits, over, prediction.step_time, cut_bytes, [j for _, j in prediction.segments])


def search(costs: ChainCosts, ranks: int, start: Sequence[Segment]) -> Prediction:
    """The best split reached from ``start`` by moving one cut one block at a time (see the module doc)."""
    best = predict(costs, start, ranks)
    best_key = _key(best, costs)
    improved = True
    while improved:
        improved = False
        ends = [j for _, j in best.segments]
        for c in range(len(ends) - 1):
            for step in (-1, 1):
                moved = list(ends)
                moved[c] += step
                low = moved[c - 1] if c else -1
                if not low < moved[c] < moved[c + 1]:
                    continue
                segments = [(e0 + 1, e1) for e0, e1 in zip([-1, *moved[:-1]], moved)]
                candidate = predict(costs, segments, ranks)
                key = _key(candidate, costs)
                if key < best_key:
                    best, best_key, improved = candidate, key, True
    return best


def balanced(costs: ChainCosts, count: int) -> list[Segment]:
    """The exact split into ``count`` chunks with the least largest chunk cost (the search's start)."""
    def cost(stage: int, i: int, j: int) -> float:
        return costs.cost(i, j)

    segments = min_max_split(len(costs.blocks), count, cost, cut_weight=costs.cut_bytes)
    assert segments is not None  # no constraint: every split is allowed
    return segments


def plan_chunks(blocks: Sequence[Block], ranks: int, settings: Settings, model: dict[str, Any],
                values: Sequence[Value] = ()) -> tuple[Plan, Prediction]:
    """The plan of a schedule running several chunks per rank: searched split, simulated (memory enforced)."""
    virtual = settings.virtual_stages or 1
    count = ranks * virtual
    if count > len(blocks):
        raise UserError(f"cannot split {len(blocks)} blocks into {ranks} ranks x {virtual} chunks "
                        f"(at most {len(blocks)} chunks at this granularity)")
    check_runs(settings.schedule, ranks, virtual, settings.micro_batches)
    found: list[tuple[Prediction, ChainCosts]] = []
    for each in (settings, replace(settings, recompute=False)):
        costs = ChainCosts(blocks, each, model.get("shared_bytes"), values)
        if each is not settings and not costs.recomputed and found:
            break  # nothing recomputed either way: the same costs
        found.append((search(costs, ranks, balanced(costs, count)), costs))
    prediction, costs = min(found, key=lambda pair: _key(pair[0], pair[1])[:3])
    if not prediction.fits:
        assert settings.memory_limit is not None
        worst = max(range(ranks), key=lambda r: prediction.rank_memory[r])
        raise UserError(f"no split into {ranks} ranks x {virtual} chunks under {settings.schedule} found that fits "
                        f"{settings.memory_limit / 1e9:.3f} GB per device: at best rank {worst} needs "
                        f"{prediction.rank_memory[worst] / 1e9:.3f} GB")
    plan = build_plan(blocks, prediction.segments, costs.settings, model, costs)
    # a chunk's memory: its state and the activations of the micro-batches it holds at once (simulated)
    plan.stages = [replace(stage, memory_bytes=round(costs.state_memory(i, j) + held * costs.activations(i, j)))
                   for stage, (i, j), held in zip(plan.stages, prediction.segments, prediction.timeline.in_flight)]
    return finish(plan, prediction, ranks), prediction


def finish(plan: Plan, prediction: Prediction, ranks: int) -> Plan:
    """``plan`` with its ranks, placement and prediction recorded."""
    schedule, virtual = plan.settings["schedule"], plan.settings.get("virtual_stages") or 1
    plan.settings = {**plan.settings, "stages": ranks}
    if schedule not in SINGLE:
        plan.placement = list(placement(schedule, ranks, virtual))
    plan.prediction = {**plan.prediction, **prediction.to_dict()}
    return plan
