"""What a stage costs: the machine settings, the recompute-or-send choice, and each segment's time and memory.

A stage costs, per micro-batch, its forward + backward compute (backward
modelled as 2x forward, or as calibrated) plus the time to send the tensors
crossing its outgoing cut, plus the time to recompute the values it chooses
to recompute rather than receive; it holds its parameters' state copies and
the activations of the micro-batches in flight under the schedule.

Recompute or send.  Each value crossing a cut that the costing found
replayable (:class:`~partitioning.plan.Recompute`) is recomputed by every
later stage reading it when that is cheaper at every cut it spans:
recomputing costs its slice's FLOPs at the device's FLOP/s plus its written
bytes at the device's memory bandwidth, and, when the slice reads trainable
parameters (which the receiving stage then holds as a replica), one
exchange of their gradient per micro-batch; the model inputs it reads must
reach the stage too (free where they cross anyway).  Sending costs the
value's bytes at the link bandwidth.  The choice is per value, the same at
every cut (so no stage recomputes a value only to pass it on), and the same
for values a backend cannot tell apart (same key).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

from common.errors import UserError
from partitioning.plan import Block, Value
from partitioning.settings import Settings


def recompute_seconds(value: Value, settings: Settings) -> float:
    """Per micro-batch, what recomputing ``value`` costs its receiving stage (it must be recomputable)."""
    assert value.recompute is not None
    r = value.recompute
    sync = r.param_bytes / settings.bandwidth if r.grad else 0.0  # the replicas' gradient exchange
    return r.flops / settings.device_flops + r.bytes / settings.memory_bandwidth + sync


def choose_recomputed(values: Sequence[Value], settings: Settings) -> set[str]:
    """Names of the values cheaper to recompute than to send at every cut they span (see the module doc)."""
    if not settings.recompute:
        return set()
    by_name = {v.name: v for v in values}
    worth: dict[str, bool] = {}
    for value in values:
        ok = value.recompute is not None
        if ok:
            assert value.recompute is not None
            seconds = recompute_seconds(value, settings)
            for cut in range(value.produced, value.last_use):
                # model inputs the slice reads and that do not cross this cut anyway must be carried across it
                extra = sum(size for name, size in value.recompute.inputs
                            if name not in by_name or not by_name[name].crosses(cut))
                ok = ok and seconds + extra / settings.bandwidth < value.bytes / settings.bandwidth
        worth[value.key] = worth.get(value.key, True) and ok
    return {v.name for v in values if worth[v.key]}


class ChainCosts:
    """Stage costs of any contiguous segment, from exact (correctly rounded) segment sums."""

    def __init__(self, blocks: Sequence[Block], settings: Settings,
                 shared_bytes: Mapping[str, int] | None = None, values: Sequence[Value] = ()) -> None:
        if settings.measured and any(b.seconds is None for b in blocks):
            missing = next(b.name for b in blocks if b.seconds is None)
            raise UserError(f"block {missing!r} has no measured time (cost with --measure, or plan on FLOPs)")
        self.blocks, self.settings = list(blocks), settings
        work = [(b.seconds or 0.0) if settings.measured else b.flops for b in blocks]  # measured: all timed (above)
        n = len(blocks)
        self._work = [[math.fsum(work[i:j + 1]) if j >= i else 0.0 for j in range(n)] for i in range(n)]
        self._params = _prefix([b.param_bytes for b in blocks])
        self._activations = _prefix([b.activation_bytes for b in blocks])
        # A block's param_bytes counts a shared weight only at its first user, but the
        # pipelining engine gives every stage that uses it a replica: charge those too.
        self._shared_users = {name: [k for k, b in enumerate(blocks) if name in b.shared]
                              for name in (shared_bytes or {})}
        self._shared_bytes = dict(shared_bytes or {})
        self.values = list(values)
        self.recomputed = choose_recomputed(self.values, settings)
        self._cut_bytes = self._sent_bytes() if self.values else [b.out_bytes for b in blocks]
        self._recomputes = [(v, recompute_seconds(v, settings)) for v in self.values if v.name in self.recomputed]
        self._by_start: dict[int, tuple[list[float], list[int]]] = {}

    def _sent_bytes(self) -> list[int]:
        """Bytes over each cut: values not recomputed, model inputs carried as far as a recomputation reads them."""
        reach = {v.name: v.last_use for v in self.values}
        sizes = {v.name: v.bytes for v in self.values}
        produced = {v.name: v.produced for v in self.values}
        for value in self.values:
            if value.name in self.recomputed:
                assert value.recompute is not None
                for name, size in value.recompute.inputs:
                    reach[name] = max(reach.get(name, 0), value.last_use)
                    sizes.setdefault(name, size)
                    produced.setdefault(name, 0)
        return [sum(sizes[name] for name, last in reach.items()
                    if name not in self.recomputed and produced[name] <= j < last) for j in range(len(self.blocks))]

    def tied_weights(self) -> list[tuple[int, list[int]]]:
        """Each weight several blocks share: its bytes and the blocks using it."""
        return [(self._shared_bytes[name], users) for name, users in self._shared_users.items() if users]

    def recomputing(self, i: int, j: int) -> list[Value]:
        """The values a stage running blocks ``i..j`` recomputes: made before it, read inside it."""
        return [v for v, _ in self._recomputes if v.produced < i and any(i <= use <= j for use in v.uses)]

    def _starting_at(self, i: int) -> tuple[list[float], list[int]]:
        """For stages starting at block ``i``, by last block ``j``: recompute seconds and replicated parameters.

        A value made before ``i`` joins once ``j`` reaches its first read at or after ``i``, so both
        grow with ``j``: one pass per ``i`` (cached) instead of a scan of the values per segment.
        """
        if i not in self._by_start:
            n = len(self.blocks)
            joins: list[list[tuple[Value, float]]] = [[] for _ in range(n)]
            for value, seconds in self._recomputes:
                later = bisect.bisect_left(value.uses, i)
                if value.produced < i and later < len(value.uses):
                    joins[value.uses[later]].append((value, seconds))
            times, params, total, held = [], [], 0.0, {}
            for j in range(n):
                for value, seconds in joins[j]:
                    total += seconds
                    assert value.recompute is not None
                    if value.recompute.grad:  # a replica of the trainable parameters it reads
                        held[value.recompute.params] = value.recompute.param_bytes
                times.append(total)
                params.append(sum(held.values()))
            self._by_start[i] = (times, params)
        return self._by_start[i]

    def recompute_time(self, i: int, j: int) -> float:
        return self._starting_at(i)[0][j] if self._recomputes else 0.0

    def _replica_bytes(self, i: int, j: int) -> int:
        total = 0
        for name, users in self._shared_users.items():
            if users and users[0] < i and bisect.bisect_left(users, i) < len(users) \
                    and users[bisect.bisect_left(users, i)] <= j:
                total += self._shared_bytes[name]
        return total

    def _replica_params(self, i: int, j: int) -> int:
        """Trainable parameters a stage holds only to recompute values (a replica each)."""
        return self._starting_at(i)[1][j] if self._recomputes else 0

    def compute(self, i: int, j: int) -> float:
        work = (1.0 + self.settings.backward_factor) * self._work[i][j]
        return work if self.settings.measured else work / self.settings.device_flops

    def forward(self, i: int, j: int) -> float:
        """The forward part of :meth:`compute`."""
        work = self._work[i][j]
        return work if self.settings.measured else work / self.settings.device_flops

    def communication(self, j: int) -> float:
        return self.cut_bytes(j) / self.settings.bandwidth

    def cost(self, i: int, j: int) -> float:
        if not self._recomputes:
            return self.compute(i, j) + self.communication(j)
        return self.compute(i, j) + self.recompute_time(i, j) + self.communication(j)

    def memory(self, stage: int, stages: int, i: int, j: int) -> float:
        return self.state_memory(i, j) + self.settings.in_flight(stage, stages) * self.activations(i, j)

    def state_memory(self, i: int, j: int) -> float:
        """Bytes of the parameters (replicas included) and their gradient and optimizer copies."""
        params = self._params[j + 1] - self._params[i] + self._replica_bytes(i, j) + self._replica_params(i, j)
        return self.settings.state_copies * params

    def activations(self, i: int, j: int) -> int:
        """Bytes saved for backward per micro-batch."""
        return self._activations[j + 1] - self._activations[i]

    def fits(self, stage: int, stages: int, i: int, j: int) -> bool:
        limit = self.settings.memory_limit
        return limit is None or self.memory(stage, stages, i, j) <= limit

    def cut_bytes(self, j: int) -> int:
        return 0 if j == len(self.blocks) - 1 else self._cut_bytes[j]


def _prefix(values: Sequence[int]) -> list[int]:
    sums = [0]
    for value in values:
        sums.append(sums[-1] + value)
    return sums
