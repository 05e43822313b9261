"""What the pipelining runtime costs beyond compute and bytes: the calibration's runtime terms, measured.

A pipelined step is not only its chunks' compute and the bytes they send
(the timeline of one, :mod:`partitioning.gpu.timeline`, shows where else it
goes).  The cost model adds three terms, each measured here on the machine:

* ``action_overhead``: seconds the engine adds to every compute action (F,
  B, I, W) of a chunk, whatever the chunk computes: measured as the median
  duration of the actions of a 2-rank GPipe pipeline of a 4 x 4 linear layer
  (whose own compute is microseconds), timed around the stage's
  ``forward_one_chunk`` / ``backward_one_chunk`` as the timeline times them
  (CPU time on a one-thread CPU rank, as the calibration times blocks);
* ``latency``: seconds per message beyond its bytes at the link bandwidth:
  half the round trip of a one-element tensor between two ranks;
* ``update_rate``: seconds per parameter byte of the optimizer step (Adam,
  as ``partition-model --run`` and ``train-model`` train) with the engine's
  gradient scaling and ``zero_grad``: :func:`update_rate`, in the calibrating
  process on the model itself, with seeded non-zero gradients (Adam's time
  per byte depends on the values: see there).

The first two run in :func:`measure_ranks` (the ranks of the calibration's
link measurement, under ``torchrun``); see
:mod:`partitioning.cost.calibration`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as engine

PROBE_MICRO_BATCHES = 8


def latency(peer: int, repeats: int, device: torch.device) -> float:
    """Half the best round trip of a one-element tensor between this rank and ``peer`` (rank 0 starts)."""
    buffer = torch.zeros(1, device=device)
    best = float("inf")
    for attempt in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        if dist.get_rank() == 0:
            dist.send(buffer, peer)
            dist.recv(buffer, peer)
        else:
            dist.recv(buffer, peer)
            dist.send(buffer, peer)
        if attempt:
            best = min(best, (time.perf_counter() - start) / 2)
    return best


def action_overhead(repeats: int, device: torch.device) -> float:
    """The median seconds of a compute action of a 2-rank GPipe step of a tiny linear layer (see the module doc)."""
    torch.manual_seed(0)
    rank = dist.get_rank()
    stage = PipelineStage(nn.Linear(4, 4).to(device), rank, 2, device)
    schedule = engine.ScheduleGPipe(stage, PROBE_MICRO_BATCHES, loss_fn=lambda output, target: output.sum())
    # the calibration's clock: a one-thread CPU rank's own CPU time (waiting for a core on a shared machine is
    # not the runtime's), else wall time
    clock = time.thread_time if device.type == "cpu" and torch.get_num_threads() == 1 else time.perf_counter
    took: list[float] = []

    def timed(method: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                took.append(clock() - start)
        return run
    stage.forward_one_chunk = timed(stage.forward_one_chunk)  # type: ignore[method-assign]
    stage.backward_one_chunk = timed(stage.backward_one_chunk)  # type: ignore[method-assign]
    batch = torch.ones(PROBE_MICRO_BATCHES, 4, device=device)
    target = torch.zeros(PROBE_MICRO_BATCHES, device=device)
    for attempt in range(repeats + 1):
        if attempt == 1:
            took.clear()  # the first step (shape inference, warm-up) is not counted
        schedule.step(*((batch,) if rank == 0 else ()), target=target if rank == 1 else None)
    return statistics.median(took)


def measure_ranks(repeats: int, device: torch.device) -> dict[str, float]:
    """On each of two ranks: the runtime's latency and action overhead (rank 0's are the ones reported)."""
    return {"latency": latency(1 - dist.get_rank(), repeats, device), "action_overhead": action_overhead(repeats, device)}


def update_rate(model: nn.Module, micro_batches: int, repeats: int, clock: Callable[[], float]) -> float:
    """Seconds per parameter byte of an Adam step, with the gradient scaling and ``zero_grad`` (module doc),
    timed with the calibration's ``clock``."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=1e-12)
    cuda = parameters[0].device.type == "cuda"
    # gradients of a trained model's size, not zeros: on a CPU, Adam over zero gradients (and so zero moments)
    # took 1.5x the time per byte (2.25 against 1.46 s/GB, t5-small's tensors, one thread): a calibration on
    # zeros over-predicted the runtime's optimizer step by 24 to 52 % (docs/benchmarks.md)
    generator = torch.Generator(parameters[0].device).manual_seed(0)
    gradients = [torch.randn(p.shape, generator=generator, device=p.device, dtype=p.dtype).mul_(1e-3)
                 for p in parameters]
    times = []
    for attempt in range(repeats + 1):
        for parameter, gradient in zip(parameters, gradients):
            parameter.grad = gradient.clone()
        if cuda:
            torch.cuda.synchronize()
        start = clock()
        with torch.no_grad():
            for parameter in parameters:
                parameter.grad.div_(micro_batches)  # type: ignore[union-attr]
        optimizer.step()
        optimizer.zero_grad()
        if cuda:
            torch.cuda.synchronize()
        if attempt:  # the first step allocates Adam's states
            times.append(clock() - start)
    total = sum(p.numel() * p.element_size() for p in parameters)
    return statistics.median(times) / total if total else 0.0
