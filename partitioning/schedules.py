"""The pipeline schedules, read from ``torch.distributed.pipelining``: their names, virtual stages, action orders.

One list of names for the planner and the runtime: :data:`SCHEDULES` is every
``Schedule*`` class the engine exports, by the lower-case name its
``get_schedule_class`` accepts.  A schedule running one stage per rank
(``gpipe``, ``1f1b``) takes ``V = 1``; a looped one (``interleaved1f1b``,
``loopedbfs``, ``interleavedzerobubble``) runs ``V >= 2`` chunks per rank,
chunk ``j`` on rank ``j mod K``; a V-shaped one (``zbvzerobubble``,
``dualpipev``) runs exactly two, rank ``r`` holding chunks ``r`` and
``2K - 1 - r``.  The placement is the engine's own ``stage_index_to_group_rank``.

The order each rank runs its actions in is the engine's too: the schedule
object is built with stub stages (no process group needed) and its
``pipeline_order`` read.  Only the one-stage schedules fall back to a closed
form: what runs there is ``_step_microbatches``, and their
``pipeline_order`` is a description that, for ``Schedule1F1B`` in torch 2.13,
is not even a valid order (the last rank runs micro-batches 1..m, never 0).
The closed forms are those of ``_step_microbatches``: GPipe runs every
forward then every backward; 1F1B runs ``min(m, K - r)`` forwards on rank
``r``, then alternates backward and forward, then drains the backwards.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from torch.distributed.pipelining import schedules as engine

from common.errors import UserError
from stateless.torch_internals import action_parts

AUTO = "auto"


def _engine_names() -> tuple[str, ...]:
    """Every schedule class the engine exports, by the name ``get_schedule_class`` maps to it."""
    names = []
    for export in engine.__all__:
        name = export.removeprefix("Schedule").lower()
        if export.startswith("Schedule") and engine.get_schedule_class(name) is getattr(engine, export):
            names.append(name)
    return tuple(names)


SCHEDULES = _engine_names()
SINGLE = tuple(name for name in SCHEDULES
               if issubclass(engine.get_schedule_class(name), engine.PipelineScheduleSingle))
V_SHAPED = ("zbvzerobubble", "dualpipev")  # the engine's style="v" mapping: two chunks per rank
LOOPED = tuple(name for name in SCHEDULES if name not in SINGLE and name not in V_SHAPED)


class Action(NamedTuple):
    """One compute action: chunk (the engine's stage index), kind F/B/I/W, micro-batch."""

    chunk: int
    kind: str  # F forward, B full backward, I input-gradient backward, W weight-gradient backward
    micro_batch: int


def schedule_name(text: str) -> str:
    """The canonical name of a schedule typed in any case ('auto' included); one line naming the known ones."""
    name = text.lower()
    if name != AUTO and name not in SCHEDULES:
        raise UserError(f"unknown schedule {text!r}; known: {', '.join(SCHEDULES)}, {AUTO}")
    return name


def default_virtual_stages(schedule: str) -> int:
    return 1 if schedule in SINGLE else 2


def check_virtual_stages(schedule: str, virtual: int) -> None:
    """``virtual`` chunks per rank are what ``schedule`` runs (one line otherwise)."""
    if schedule in SINGLE and virtual != 1:
        raise UserError(f"the {schedule} schedule runs one stage per rank: virtual stages must be 1, got {virtual}")
    if schedule in LOOPED and virtual < 2:
        raise UserError(f"the {schedule} schedule loops over chunks: virtual stages must be >= 2, got {virtual}")
    if schedule in V_SHAPED and virtual != 2:
        raise UserError(f"the {schedule} schedule runs a V of two chunks per rank: virtual stages must be 2, "
                        f"got {virtual}")


class _Stub:
    """What a schedule's constructor reads from a stage: its index, the stage count, the group."""

    def __init__(self, index: int, stages: int, ranks: int, rank: int) -> None:
        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, stages, ranks, rank
        self.submod = None  # not a module: the torch.compile check skips it
        self.is_first, self.is_last = index == 0, index == stages - 1


@functools.lru_cache(maxsize=256)
def _built(schedule: str, ranks: int, virtual: int, micro_batches: int) -> Any:
    """The engine's schedule object for rank 0 of ``ranks`` with ``virtual`` chunks each (errors: one line)."""
    check_virtual_stages(schedule, virtual)
    cls = engine.get_schedule_class(schedule)
    chunks = ranks * virtual
    rank0 = [0] if schedule in SINGLE else [0, chunks - 1] if schedule in V_SHAPED else list(range(0, chunks, ranks))
    stubs = [_Stub(index, chunks, ranks, 0) for index in rank0]
    quiet = logging.getLogger("torch.distributed.pipelining.schedules")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the interleaved zero-bubble schedule warns about every bubble it adds
    try:
        return cls(stubs[0] if schedule in SINGLE else stubs, micro_batches, loss_fn=_loss)
    except (ValueError, RuntimeError, AssertionError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"the {schedule} schedule cannot run {micro_batches} micro-batches on {ranks} ranks "
                        f"x {virtual} chunks: {reason}") from None
    finally:
        quiet.setLevel(level)


def _loss(output: Any, target: Any) -> Any:
    return output


def check_runs(schedule: str, ranks: int, virtual: int, micro_batches: int) -> None:
    """The engine accepts this schedule for these counts (its own check: one line otherwise)."""
    _built(schedule, ranks, virtual, micro_batches)


def placement(schedule: str, ranks: int, virtual: int) -> tuple[int, ...]:
    """The rank of each chunk, in chain order: the engine's mapping."""
    if schedule in SINGLE:
        return tuple(range(ranks))
    mapping = _built(schedule, ranks, virtual, max(2 * ranks, 1)).stage_index_to_group_rank
    return tuple(mapping[chunk] for chunk in range(ranks * virtual))


@functools.lru_cache(maxsize=256)
def orders(schedule: str, ranks: int, virtual: int, micro_batches: int) -> tuple[tuple[Action, ...], ...]:
    """The compute actions each rank runs, in order (idle steps dropped, overlapped F+B as F then B)."""
    if schedule == "gpipe":
        return tuple(tuple(Action(r, "F", m) for m in range(micro_batches))
                     + tuple(Action(r, "B", m) for m in range(micro_batches)) for r in range(ranks))
    if schedule == "1f1b":
        return tuple(_one_f_one_b(r, ranks, micro_batches) for r in range(ranks))
    built = _built(schedule, ranks, virtual, micro_batches)
    return tuple(tuple(_flatten(built.pipeline_order[r])) for r in range(ranks))


def _one_f_one_b(rank: int, ranks: int, micro_batches: int) -> tuple[Action, ...]:
    warmup = min(micro_batches, ranks - rank)
    actions = [Action(rank, "F", m) for m in range(warmup)]
    for m in range(micro_batches - warmup):
        actions += [Action(rank, "B", m), Action(rank, "F", warmup + m)]
    actions += [Action(rank, "B", m) for m in range(micro_batches - warmup, micro_batches)]
    return tuple(actions)


def _flatten(actions: Sequence[Any]) -> list[Action]:
    flat = []
    for action in actions:
        if action is None:
            continue
        for chunk, kind, micro_batch in action_parts(action):  # OVERLAP_F_B: the runtime runs its parts in turn
            if kind in ("F", "B", "I", "W"):
                assert micro_batch is not None, action  # every compute action names its micro-batch
                flat.append(Action(chunk, kind, micro_batch))
    return flat


def streams(schedule: str, ranks: int, virtual: int, micro_batches: int, replicas: int) -> bool:
    """Whether the ordered sum runs during the schedule: one replica, every backward whole and in micro-batch order."""
    if replicas > 1:
        return False
    for order in orders(schedule, ranks, virtual, micro_batches):
        done: dict[int, int] = {}  # chunk -> backwards run
        for action in order:
            if action.kind in ("I", "W"):
                return False
            if action.kind == "B":
                if action.micro_batch != done.get(action.chunk, 0):
                    return False
                done[action.chunk] = action.micro_batch + 1
    return True


def chain_streams(holders: Sequence[int], ranks_of: Sequence[int]) -> bool:
    """Whether one weight's chain of holders crosses each link (a pair of ranks, one way) at most once.

    Then every link carries one message a micro-batch, sent and received in micro-batch order: the order
    NCCL matches point-to-point messages in (it ignores tags).  A chain crossing a link twice (looped
    placements with three or more holders) sums after the schedule.
    """
    chain = sorted(holders, reverse=True)
    hops = [(ranks_of[a], ranks_of[b]) for a, b in zip(chain, chain[1:]) if ranks_of[a] != ranks_of[b]]
    return len(hops) == len(set(hops))
