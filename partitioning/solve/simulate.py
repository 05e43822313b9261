"""Step time and peak activation memory of a pipeline schedule, simulated from per-chunk costs.

Each rank runs its actions in the order the schedule gives it
(:func:`partitioning.schedules.orders`), one at a time, each as soon
as the rank is free and its inputs are there:

* ``F`` of chunk ``c``, micro-batch ``m``: after ``F`` of chunk ``c - 1``
  for ``m``, plus the send time of chunk ``c - 1``'s output when that chunk
  is on another rank;
* ``B`` or ``I`` (the input-gradient part of a backward): after ``B``/``I``
  of chunk ``c + 1`` for ``m`` (plus the send time back, the gradient being
  as large as the activation), or after ``F`` of the last chunk's own ``m``
  (its loss);
* ``W`` (the weight-gradient part): after ``I`` of the same chunk and ``m``.

``B`` costs the whole backward, ``I`` its input-gradient part, ``W`` the
rest; every action also costs the chunk's ``overhead`` (the runtime's own
seconds per action, calibrated).  Sends are link delays that do not occupy either rank (the engine's
sends are asynchronous), one per crossing, without link contention.

Memory: a chunk holds a micro-batch's activations from its ``F`` until the
backward that finishes with them (``B``, or ``W`` when split; holding them
through ``W`` over-counts what ``I`` already freed).  A rank runs one action
at a time, so its peak depends on its order only: the largest running sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from common.errors import UserError
from partitioning.schedules import Action


@dataclass(frozen=True)
class ChunkCost:
    """Per micro-batch: a chunk's forward and backward seconds, its output's send seconds, activations held."""

    forward: float
    backward: float  # the whole backward (input and weight gradients)
    weight: float = 0.0  # the weight-gradient part of ``backward``, run alone as W where the schedule splits it
    send: float = 0.0  # seconds to send the chunk's output to the next chunk's rank (and its gradient back)
    activation: float = 0.0  # bytes held per micro-batch in flight
    overhead: float = 0.0  # seconds the runtime adds to each of the chunk's actions


@dataclass(frozen=True)
class Timeline:
    step_time: float  # seconds from the first action's start to the last one's end
    busy: tuple[float, ...]  # per rank: seconds computing
    peak_activations: tuple[float, ...]  # per rank: most activation bytes held at once
    in_flight: tuple[int, ...]  # per chunk: most micro-batches whose activations it holds at once
    ends: dict[Action, float]  # when each action ends

    @property
    def bubble(self) -> float:
        """The share of the ranks' time spent idle: 1 - sum(busy) / (ranks x step time)."""
        total = len(self.busy) * self.step_time
        return 1.0 - sum(self.busy) / total if total > 0 else 0.0


def duration(action: Action, chunk: ChunkCost) -> float:
    if action.kind == "F":
        return chunk.forward + chunk.overhead
    if action.kind == "B":
        return chunk.backward + chunk.overhead
    return (chunk.weight if action.kind == "W" else chunk.backward - chunk.weight) + chunk.overhead


def simulate(orders: Sequence[Sequence[Action]], placement: Sequence[int], chunks: Sequence[ChunkCost]) -> Timeline:
    """Run ``orders`` (per rank) on chunks placed on ranks by ``placement`` (see the module doc)."""
    if len(placement) != len(chunks):
        raise UserError(f"{len(chunks)} chunk costs for {len(placement)} placed chunks")
    last = len(chunks) - 1
    ends: dict[Action, float] = {}
    grad: dict[tuple[int, int], float] = {}  # (chunk, micro-batch): when its input gradient is ready
    position = [0] * len(orders)
    free = [0.0] * len(orders)
    busy = [0.0] * len(orders)
    remaining = sum(len(order) for order in orders)
    while remaining:
        progressed = False
        for rank, order in enumerate(orders):
            while position[rank] < len(order):
                action = order[position[rank]]
                ready = _ready(action, ends, grad, placement, chunks, last)
                if ready is None:
                    break
                took = duration(action, chunks[action.chunk])
                end = max(free[rank], ready) + took
                ends[action] = free[rank] = end
                busy[rank] += took
                if action.kind in ("B", "I"):
                    grad[action.chunk, action.micro_batch] = end
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = [str(order[position[r]]) for r, order in enumerate(orders) if position[r] < len(order)]
            raise UserError(f"the schedule deadlocks under its dependencies: waiting {', '.join(stuck)}")
    peaks, in_flight = _memory(orders, chunks)
    return Timeline(max(ends.values(), default=0.0), tuple(busy), peaks, in_flight, ends)


def _ready(action: Action, ends: dict[Action, float], grad: dict[tuple[int, int], float],
           placement: Sequence[int], chunks: Sequence[ChunkCost], last: int) -> float | None:
    """When ``action``'s inputs are there, or None while one is not computed yet."""
    c, m = action.chunk, action.micro_batch
    if action.kind == "F":
        if c == 0:
            return 0.0
        before = ends.get(Action(c - 1, "F", m))
        if before is None:
            return None
        return before + (chunks[c - 1].send if placement[c - 1] != placement[c] else 0.0)
    if action.kind == "W":
        return ends.get(Action(c, "I", m))
    own = ends.get(Action(c, "F", m))
    if own is None:
        return None
    if c == last:
        return own
    after = grad.get((c + 1, m))
    if after is None:
        return None
    return max(own, after + (chunks[c].send if placement[c] != placement[c + 1] else 0.0))


def _memory(orders: Sequence[Sequence[Action]], chunks: Sequence[ChunkCost]) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Per rank the peak activation bytes, per chunk the peak micro-batches held (see the module doc)."""
    peaks = []
    held_by_chunk = [0] * len(chunks)
    most = [0] * len(chunks)
    for order in orders:
        held = peak = 0.0
        for action in order:
            if action.kind == "F":
                held += chunks[action.chunk].activation
                held_by_chunk[action.chunk] += 1
                most[action.chunk] = max(most[action.chunk], held_by_chunk[action.chunk])
                peak = max(peak, held)
            elif action.kind in ("B", "W"):
                held -= chunks[action.chunk].activation
                held_by_chunk[action.chunk] -= 1
        peaks.append(peak)
    return tuple(peaks), tuple(most)
