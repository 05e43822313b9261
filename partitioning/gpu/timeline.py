"""A per-rank timeline of pipelined steps: when each action of the runtime starts and ends, on every rank.

Opt-in (``partition-model --run --timeline FILE``, ``scripts/bench_pipeline.py``):
:func:`attach` wraps the methods of one
:class:`~partitioning.gpu.pipelining.PipelineRun`, and :meth:`Recorder.step`
the engine's two p2p helpers for the step it frames; nothing is wrapped when
no timeline is asked for, so a run without one pays nothing.  The recorded kinds:

* ``F``, ``B``, ``I``, ``W``: a chunk's forward, whole backward, input- and
  weight-gradient backward for one micro-batch (the stage's
  ``forward_one_chunk`` / ``backward_one_chunk`` / ``backward_weight_one_chunk``:
  the schedule's actions as the engine runs them, in either runtime:
  ``_step_microbatches`` of the one-stage schedules and of
  ``_PipelineScheduleRuntime``).  A recomputed value's replay and the copy of
  the inputs on stage 0 are nodes of the stage graphs, so they are inside
  ``F`` (their share is the cost model's ``recompute_time``);
* ``post_send`` / ``post_recv`` / ``post_sendrecv``: handing a batch of p2p
  operations to the backend (``_batch_p2p``; 1F1B's steady state posts a
  send and a receive together); ``wait_send`` / ``wait_recv`` /
  ``wait_sendrecv``: waiting for them (``_wait_batch_p2p``), where a rank
  stands idle for a neighbour (empty batches are not events);
* ``link_send`` / ``link_recv`` / ``link_finish``: a recomputed value's
  gradient going back to its maker (inside the backward that sends or needs it);
* ``split_inputs``: cutting the batch into micro-batches; ``reduce_grad``: the
  engine's per-stage gradient scaling after the last backward;
* ``tied_sync``: summing the copies of tied weights' gradients;
  ``optimizer``: the optimizer step (recorded by the caller, :meth:`Recorder.span`);
* ``step``: the whole step as the caller frames it.

Times are ``time.perf_counter`` seconds since the step's start, taken after a
barrier on every rank; ``cpu`` is the thread's CPU time in the span (a rank
waiting for a core or for a message does not advance it).  Spans nest (a
``link_recv`` inside a ``B``): each event names the span it ran in
(``inside``), and :func:`breakdown` counts each second once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed as dist

from common.atomic import write_atomic
from stateless.torch_internals import SPLIT_INPUTS, p2p_helpers, set_p2p_helpers

FORMAT = 1
COMPUTE = ("F", "B", "I", "W")


class Recorder:
    """The events of this rank; :meth:`span` times one, :meth:`step` frames a step."""

    def __init__(self, rank: int) -> None:
        self.rank, self.step_index = rank, -1
        self.events: list[dict[str, Any]] = []
        self._origin = 0.0
        self._open: list[str] = []
        self._undo: list[Callable[[], None]] = []
        self._labels: dict[int, str] = {}  # id of a p2p Work -> "send" / "recv" / "sendrecv"

    @contextmanager
    def span(self, kind: str, chunk: int = -1, micro_batch: int = -1) -> Iterator[None]:
        inside = self._open[-1] if self._open else ""
        self._open.append(kind)
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            end, cpu_end = time.perf_counter(), time.thread_time()
            self._open.pop()
            self.events.append({"rank": self.rank, "step": self.step_index, "kind": kind, "chunk": chunk,
                                "micro_batch": micro_batch, "start": start - self._origin,
                                "end": end - self._origin, "cpu": cpu_end - cpu, "inside": inside})

    @contextmanager
    def step(self, group: dist.ProcessGroup | None = None) -> Iterator[None]:
        """One step, its clock started after a barrier on ``group`` (every rank's zero is the same moment)."""
        dist.barrier(group=group)
        self.step_index += 1
        restore = self._patch_p2p()  # the engine's helpers are global: patched for this recorder's step only
        self._origin = time.perf_counter()
        try:
            with self.span("step"):
                yield
        finally:
            restore()

    def wrap(self, owner: Any, name: str, describe: Callable[..., tuple[str, int, int]]) -> None:
        """Time ``owner.name(...)`` as the span ``describe(*args, **kwargs)`` names (kind, chunk, micro-batch)."""
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.span(*describe(*args, **kwargs)):
                return original(*args, **kwargs)
        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original))

    def detach(self) -> None:
        """Put back every method :func:`attach` wrapped."""
        while self._undo:
            self._undo.pop()()

    def _patch_p2p(self) -> Callable[[], None]:
        post, wait = p2p_helpers()

        def batch_p2p(ops: list[dist.P2POp], desc: str | None = None) -> list[dist.Work]:
            if not ops:  # the engine asks for every (possibly empty) batch: only real messages are events
                return post(ops, desc)
            kinds = {"send" if op.op is dist.isend else "recv" for op in ops}
            label = kinds.pop() if len(kinds) == 1 else "sendrecv"
            with self.span(f"post_{label}"):
                works = post(ops, desc)
            for work in works:
                self._labels[id(work)] = label
            return works

        def wait_batch_p2p(works: list[dist.Work]) -> None:
            if not works:
                return wait(works)
            label = self._labels.get(id(works[0]), "recv")
            with self.span(f"wait_{label}"):
                wait(works)
            for work in works:
                self._labels.pop(id(work), None)
        set_p2p_helpers(batch_p2p, wait_batch_p2p)

        def restore() -> None:
            set_p2p_helpers(post, wait)
        return restore


def attach(run: Any) -> Recorder:
    """A recorder of ``run``'s (a PipelineRun's) steps on this rank; :meth:`Recorder.detach` takes it off."""
    recorder = Recorder(dist.get_rank())
    for stage in run.chunk_stages:
        chunk = stage.stage_index
        recorder.wrap(stage, "forward_one_chunk", lambda mb, *a, _c=chunk, **k: ("F", _c, mb))
        recorder.wrap(stage, "backward_one_chunk",
                      lambda mb, *a, _c=chunk, full_backward=True, **k: ("B" if full_backward else "I", _c, mb))
        recorder.wrap(stage, "backward_weight_one_chunk", lambda mb, *a, _c=chunk, **k: ("W", _c, mb))
        recorder.wrap(stage, "perform_reduce_grad", lambda *a, _c=chunk, **k: ("reduce_grad", _c, -1))
    recorder.wrap(run.schedule, SPLIT_INPUTS, lambda *a, **k: ("split_inputs", -1, -1))
    recorder.wrap(run, "sync_tied_gradients", lambda *a, **k: ("tied_sync", -1, -1))
    for link in run.recomputation.links:
        for name in ("send", "receive", "finish"):
            kind = {"send": "link_send", "receive": "link_recv", "finish": "link_finish"}[name]
            recorder.wrap(link, name, lambda *a, _k=kind, **k: (_k, -1, -1))
    return recorder


@contextmanager
def step_of(recorder: Recorder | None, group: dist.ProcessGroup | None = None) -> Iterator[None]:
    """``recorder.step()``, or nothing at all (no barrier) without a recorder."""
    if recorder is None:
        yield
        return
    with recorder.step(group):
        yield


@contextmanager
def span_of(recorder: Recorder | None, kind: str) -> Iterator[None]:
    """``recorder.span(kind)``, or nothing at all without a recorder."""
    if recorder is None:
        yield
        return
    with recorder.span(kind):
        yield


def gather(recorder: Recorder, group: dist.ProcessGroup | None = None) -> list[dict[str, Any]] | None:
    """Every rank's events, on rank 0 of ``group`` (None elsewhere)."""
    everyone: list[Any] = [None] * dist.get_world_size(group)
    first = dist.get_global_rank(group, 0) if group is not None else 0
    dist.gather_object(recorder.events, everyone if dist.get_rank() == first else None, dst=first, group=group)
    return [event for events in everyone for event in events] if dist.get_rank() == first else None


def write(path: Path, events: list[dict[str, Any]], **about: Any) -> None:
    """The timeline JSON (``about``: schedule, ranks, micro-batches...), written atomically."""
    write_atomic(path, (json.dumps({"format": FORMAT, **about, "events": events}, indent=1) + "\n").encode())


def breakdown(events: list[dict[str, Any]], step: int) -> dict[int, dict[str, float]]:
    """Per rank, the seconds of ``step`` by kind, each second once (a span's time less the spans inside it),
    ``step`` the whole step and ``idle`` what no span covers."""
    found: dict[int, dict[str, float]] = {}
    mine = [e for e in events if e["step"] == step]
    for event in mine:
        rank = found.setdefault(event["rank"], {})
        took = event["end"] - event["start"]
        rank[event["kind"]] = rank.get(event["kind"], 0.0) + took
        if event["inside"] and event["inside"] != "step":
            rank[event["inside"]] = rank.get(event["inside"], 0.0) - took
    for rank in found.values():
        covered = sum(seconds for kind, seconds in rank.items() if kind != "step")
        rank["idle"] = rank.get("step", 0.0) - covered
    return found
