"""Calibration: what one machine measured, saved once and used to plan many shapes.

``partition-model FAMILY --version V --calibrate FILE --device cpu|cuda`` times,
on the machine the pipeline will run on,

* every block's forward (sub-layer granularity, median of repeats, the
  costing's timing run) and the model's forward and forward + backward, whose
  ratio gives the backward factor (the plan's default models backward as 2x);
* the achieved FLOP/s over the blocks that compute, and the memory bandwidth
  of a large copy (what recomputing a value costs);
* the bandwidth between two ranks with the backend the pipeline uses (gloo on
  CPU, NCCL between two GPUs), by a ping-pong of the largest tensor crossing a
  cut, under ``torchrun``;
* the runtime's own terms (:mod:`partitioning.cost.runtime`): the latency of
  a message, the engine's overhead per compute action (both on those ranks)
  and the optimizer step's seconds per parameter byte.  Files without them
  (written before) read as 0: the model then predicts compute and bytes only.

``--calibration FILE`` plans from it: a block the calibration timed at the
same model and micro-batch keeps its time; otherwise its time is its FLOPs at
the rate calibrated for the same role (the block's name with the layer index
dropped: ``encoder.block.#.layer.1``; a layer block takes the rate of its
sub-layers), and the whole model's rate where no role matches.  Blocks without
FLOPs (embeddings, norms) scale with their saved activation bytes.  That is
first-order (matmul efficiency changes with shape), which is why a
calibration at the shape you plan is exact and one at another shape is not.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Annotated, Any, Literal

import torch
import torch.distributed as dist

from common.errors import UserError
from common.files import parse_json
from common.schema import FILE, Check, Count, NonNegative, OptionError, PositiveInt, Text, fail, parse_options
from partitioning.cost import runtime
from partitioning.cost.costing import Chain
from partitioning.plan import Block, layer_of
from partitioning.settings import Settings

FORMAT: Literal[1] = 1


Rate = Annotated[float, Check("a positive rate", lambda rate: rate > 0,
                             hint=lambda rate: " (non-positive)" if isinstance(rate, (int, float)) else "")]


@dataclass(frozen=True)
class TimedBlock:
    """The schema of one block a calibration timed (kept as the dict it reads)."""

    name: Text
    flops: NonNegative
    seconds: NonNegative
    activation_bytes: Count = 0


@dataclass
class Calibration:
    device: str  # "cpu" or the GPU's name
    threads: PositiveInt  # intra-op threads the timings ran with (one per pipeline rank on CPU)
    backend: str  # torch.distributed backend the bandwidth was measured with
    bandwidth: Rate  # bytes/s one way between two ranks
    memory_bandwidth: Rate  # bytes/s of a device-memory copy (read + write)
    flops: Rate  # achieved FLOP/s over the timed blocks that compute
    backward_factor: NonNegative  # (forward + backward) / forward - 1, of the whole model
    model: dict[str, Any]  # family, version, class, shape, config, micro_batch it was measured on
    latency: NonNegative = 0.0  # seconds per message beyond its bytes at the bandwidth
    action_overhead: NonNegative = 0.0  # seconds the engine adds to each compute action of a chunk
    update_rate: NonNegative = 0.0  # seconds per parameter byte of the optimizer step
    blocks: list[dict[str, Any]] = field(default_factory=list)  # name, flops, seconds, activation_bytes (TimedBlock)
    machine: str = ""
    format: Literal[1] = FORMAT

    def __post_init__(self) -> None:
        for index, block in enumerate(self.blocks):
            try:
                parse_options(TimedBlock, block)
            except OptionError as error:
                raise OptionError(f"blocks[{index}]", f"bad block: {error.render(FILE)}") from None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, source: str = "calibration") -> Calibration:
        try:
            return parse_options(cls, parse_json(text))
        except OptionError as error:
            raise fail(error, f"{source} is not a calibration file") from None
        except ValueError as exc:  # not JSON
            raise UserError(f"{source} is not a calibration file: {exc}") from None

    def settings(self, base: Settings) -> Settings:
        """``base`` with this machine's rates; compute is costed on (calibrated) seconds."""
        return replace(base, device_flops=self.flops, bandwidth=self.bandwidth,
                       memory_bandwidth=self.memory_bandwidth, backward_factor=self.backward_factor, measured=True,
                       latency=self.latency, action_overhead=self.action_overhead, update_rate=self.update_rate)

    def apply(self, chain: Chain, layer_lists: Sequence[str], model: dict[str, Any]) -> Chain:
        """``chain`` with every block's forward seconds from this calibration (see the module doc)."""
        keys = ("family", "version", "class", "config", "micro_batch")
        same = _plain({k: self.model.get(k) for k in keys}) == _plain({k: model.get(k) for k in keys})
        exact = {b["name"]: b for b in self.blocks} if same else {}
        roles: dict[str, list[dict[str, Any]]] = {}
        for block in self.blocks:
            roles.setdefault(role(block["name"], layer_lists), []).append(block)
        return replace(chain, blocks=[replace(b, seconds=self._seconds(b, exact, roles, layer_lists))
                                      for b in chain.blocks])

    def _seconds(self, block: Block, exact: dict[str, dict[str, Any]], roles: dict[str, list[dict[str, Any]]],
                 layer_lists: Sequence[str]) -> float:
        if block.name in exact:
            return float(exact[block.name]["seconds"])
        mine = role(block.name, layer_lists)
        similar = [b for name, group in roles.items() for b in group
                   if name == mine or name.startswith(mine + ".") or mine.startswith(name + ".")]
        flops = sum(b["flops"] for b in similar)
        if block.flops and flops:
            return block.flops * sum(b["seconds"] for b in similar) / flops
        if not block.flops and similar:
            seconds = statistics.fmean(b["seconds"] for b in similar)
            saved = statistics.fmean(b.get("activation_bytes", 0) for b in similar)
            return seconds * block.activation_bytes / saved if saved and block.activation_bytes else seconds
        return block.flops / self.flops


def _plain(value: Any) -> Any:
    """``value`` as JSON gives it back (tuples become lists), so a saved record compares equal to a fresh one."""
    return json.loads(json.dumps(value, sort_keys=True))


def role(name: str, layer_lists: Sequence[str]) -> str:
    """A block's name with its layer's index replaced by ``#``: the blocks that do the same work."""
    layer = layer_of(name, layer_lists)
    if layer is None:
        return name
    owner = layer.rpartition(".")[0]
    return owner + ".#" + name[len(layer):]


def clock(device: torch.device | str) -> Callable[[], float]:
    """How compute is timed: on a CPU with one intra-op thread, that thread's CPU time (on a shared machine
    the time spent waiting for a core is not the model's); otherwise wall time."""
    if torch.device(device).type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def _median_seconds(run: Any, repeats: int, sync: Any, timer: Callable[[], float] = time.perf_counter) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        sync()
        start = timer()
        run()
        sync()
        times.append(timer() - start)
    return statistics.median(times)


def measure_model(model: torch.nn.Module, inputs: dict[str, torch.Tensor], repeats: int) -> tuple[float, float]:
    """Median seconds of the model's forward and of its forward + backward."""
    device = next(model.parameters()).device
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def forward() -> None:
        model(**inputs)

    def forward_backward() -> None:
        model(**inputs).backward()
        model.zero_grad(set_to_none=True)

    timer = clock(device)
    return _median_seconds(forward, repeats, sync, timer), _median_seconds(forward_backward, repeats, sync, timer)


def memory_bandwidth(device: torch.device, size: int = 1 << 26, repeats: int = 5) -> float:
    """Bytes/s of copying ``size`` bytes within device memory (a read and a write of each byte), timed with the
    calibration's clock (on a shared CPU, wall time would count the waits for a core)."""
    source = torch.ones(size // 4, device=device)
    target = torch.empty_like(source)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    return 2 * size / _median_seconds(lambda: target.copy_(source), repeats, sync, clock(device))


def send_bandwidth(size: int, repeats: int = 5) -> tuple[float, str, dict[str, float]]:
    """Bytes/s one way between two ranks (ping-pong under torchrun), the backend it used, the runtime's terms."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "-m", "partitioning.cost.calibration", str(size), str(repeats)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    found = re.search(r"^bandwidth (\S+) (\S+)$", result.stdout, re.MULTILINE)
    if result.returncode or not found:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"the bandwidth measurement failed (torchrun exit {result.returncode}): {tail[0]}")
    terms = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("runtime "))[8:])
    return float(found.group(1)), found.group(2), terms


def _ping_pong(size: int, repeats: int) -> None:
    """One rank of send_bandwidth: rank 0 sends, rank 1 returns; the time of 2 x repeats one-way transfers."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    if cuda:
        torch.cuda.set_device(local)
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend)
    try:
        rank, device = dist.get_rank(), torch.device("cuda", local) if cuda else torch.device("cpu")
        buffer = torch.ones(max(1, size // 4), device=device)
        peer = 1 - rank
        best = float("inf")
        for attempt in range(repeats + 1):  # the first round warms the connection up
            dist.barrier()
            start = time.perf_counter()
            if rank == 0:
                dist.send(buffer, peer)
                dist.recv(buffer, peer)
            else:
                dist.recv(buffer, peer)
                dist.send(buffer, peer)
            if cuda:
                torch.cuda.synchronize()
            if attempt:
                best = min(best, (time.perf_counter() - start) / 2)
        terms = runtime.measure_ranks(repeats, device)
        if rank == 0:
            print(f"bandwidth {buffer.numel() * buffer.element_size() / best} {backend}", flush=True)
            print(f"runtime {json.dumps(terms)}", flush=True)
    finally:
        dist.destroy_process_group()


def calibrate(chain: Chain, model: torch.nn.Module, inputs: dict[str, torch.Tensor], described: dict[str, Any],
              repeats: int, threads: int, bandwidth: float | None = None, micro_batches: int = 1) -> Calibration:
    """A calibration from a chain costed with ``measure_repeats`` on the real device, and the model it ran."""
    if any(b.seconds is None for b in chain.blocks):
        raise UserError("calibration needs the chain's blocks timed on a real device")
    device = next(model.parameters()).device
    forward, forward_backward = measure_model(model, inputs, repeats)
    computing = [b for b in chain.blocks if b.flops]
    flops = sum(b.flops for b in computing) / sum(b.seconds or 0.0 for b in computing)
    biggest = max((v.bytes for v in chain.values), default=1 << 20)
    size = min(max(biggest, 1 << 20), 1 << 28)
    backend, terms = "given", {"latency": 0.0, "action_overhead": 0.0}
    if bandwidth is None:
        bandwidth, backend, terms = send_bandwidth(size, repeats)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return Calibration(device=name, threads=threads, backend=backend, bandwidth=bandwidth,
                       memory_bandwidth=memory_bandwidth(device, repeats=repeats), flops=flops,
                       backward_factor=max(0.0, forward_backward / forward - 1.0), model=described,
                       update_rate=runtime.update_rate(model, micro_batches, repeats, clock(device)),
                       latency=terms["latency"], action_overhead=terms["action_overhead"],
                       blocks=[{"name": b.name, "flops": b.flops, "seconds": b.seconds,
                                "activation_bytes": b.activation_bytes} for b in chain.blocks],
                       machine=f"{platform.node()} ({platform.processor() or platform.machine()}, "
                               f"{os.cpu_count()} cores)")


if __name__ == "__main__":  # a rank of send_bandwidth
    _ping_pong(int(sys.argv[1]), int(sys.argv[2]))
