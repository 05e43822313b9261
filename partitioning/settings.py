"""The settings a plan is made for and its run reads: the contract the planner hands the runtime.

``partition-model`` records them in the plan (``plan.settings``); the runtime (``--run``, ``train-model``, the
IPU target) reads them back with :meth:`Settings.from_plan` and never the solver that chose them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from common.errors import UserError
from common.schema import OptionError, parse_options
from partitioning.schedules import AUTO, SCHEDULES, check_virtual_stages, default_virtual_stages

TIED_SUMS = ("ordered", "allreduce")  # how a run sums the gradients of a weight several chunks hold


@dataclass(frozen=True)
class Settings:
    """The machine and the training setup a plan is made for."""

    device_flops: float = 100e12  # sustained FLOP/s of one device
    bandwidth: float = 25e9  # bytes/s between neighbouring stages
    memory_limit: float | None = None  # bytes per device; None: unlimited
    micro_batches: int = 1
    schedule: str = "1f1b"
    optimizer_states: int = 2  # extra copies of every parameter: Adam keeps exp_avg and exp_avg_sq
    master_weights: bool = False  # mixed precision keeps one more (fp32 master) copy
    measured: bool = False  # cost compute with the blocks' measured seconds instead of FLOPs
    memory_bandwidth: float = 2e12  # bytes/s a device reads/writes its memory (recompute cost)
    backward_factor: float = 2.0  # backward time as a multiple of forward time
    recompute: bool = True  # recompute crossing values where cheaper than sending them
    virtual_stages: int | None = None  # chunks per rank (None: the schedule's default, 1 or 2; "auto": chosen)
    weight_gradient: float = 0.5  # share of the backward computing weight gradients (W, split off by zero bubble)
    # the runtime's own costs (calibrated: partitioning.cost.runtime; 0 = compute and bytes only)
    latency: float = 0.0  # seconds per message beyond its bytes at the bandwidth
    action_overhead: float = 0.0  # seconds the engine adds to every compute action (F, B, I, W) of a chunk
    update_rate: float = 0.0  # seconds per parameter byte of the optimizer step
    tied_sum: str = "ordered"  # the run's sum of a tied weight's copies (--run and train-model default to it)

    def __post_init__(self) -> None:
        # Finite too: the flags are finite, but TFLOP/s x 1e12 can overflow to infinity, which JSON cannot hold.
        if not 0 < self.device_flops < math.inf or not 0 < self.bandwidth < math.inf:
            raise UserError(f"device FLOP/s ({self.device_flops:g}) and bandwidth ({self.bandwidth:g} B/s) must be "
                            f"finite and positive")
        if self.micro_batches < 1:
            raise UserError(f"micro-batches must be at least 1, got {self.micro_batches}")
        if self.schedule not in SCHEDULES and self.schedule != AUTO:
            raise UserError(f"unknown schedule {self.schedule!r}; known: {', '.join(SCHEDULES)}, {AUTO}")
        if self.virtual_stages is None and self.schedule != AUTO:  # frozen: settle the default once, here
            object.__setattr__(self, "virtual_stages", default_virtual_stages(self.schedule))
        if self.virtual_stages is not None and self.schedule != AUTO:
            check_virtual_stages(self.schedule, self.virtual_stages)
        if self.virtual_stages is not None and self.virtual_stages < 1:
            raise UserError(f"virtual stages must be at least 1, got {self.virtual_stages}")
        if not 0 <= self.weight_gradient <= 1:
            raise UserError(f"the weight-gradient share of the backward must be in [0, 1], got {self.weight_gradient}")
        if self.memory_limit is not None and not 0 < self.memory_limit < math.inf:
            raise UserError(f"the memory limit must be finite and positive, got {self.memory_limit:g} bytes")
        if self.optimizer_states < 0:
            raise UserError(f"optimizer states must be >= 0, got {self.optimizer_states}")
        if not self.memory_bandwidth > 0 or not self.backward_factor >= 0:
            raise UserError("memory bandwidth must be positive and the backward factor non-negative")
        if self.tied_sum not in TIED_SUMS:
            raise UserError(f"unknown tied sum {self.tied_sum!r}; known: {', '.join(TIED_SUMS)}")
        if not min(self.latency, self.action_overhead, self.update_rate) >= 0:
            raise UserError("the runtime's latency, action overhead and update rate must be non-negative")

    @property
    def runtime_terms(self) -> bool:
        """The settings carry the runtime's own costs (a calibration measured them)."""
        return self.latency > 0 or self.action_overhead > 0 or self.update_rate > 0

    @classmethod
    def from_plan(cls, settings: Mapping[str, Any]) -> Settings:
        """The settings a plan file records (those this release knows; it records more), each of its field's type."""
        known = {key: value for key, value in settings.items() if key in cls.__dataclass_fields__}
        try:
            return parse_options(cls, known)
        except OptionError as error:  # a bare type's fault: the default shows the type
            raise UserError(f"not a plan file: settings.{error.key} must be like "
                            f"{cls.__dataclass_fields__[error.key].default!r}, got {error.value!r:.40}") from None

    @property
    def state_copies(self) -> int:
        """Bytes held per parameter byte: weights, gradients, optimizer states, master copy."""
        return 2 + self.optimizer_states + int(self.master_weights)

    def in_flight(self, stage: int, stages: int) -> int:
        """Micro-batches whose activations a stage holds at once under the schedule."""
        if self.schedule == "gpipe":
            return self.micro_batches  # every forward runs before the first backward
        return min(self.micro_batches, stages - stage)  # 1F1B: warm-up depth of this stage

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
