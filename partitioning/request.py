"""What ``partition-model`` is asked to do: its command line as typed values (``partitioning.cli`` parses it).

Library code takes a :class:`Request` (or the values it holds), never the
parser's namespace.  A target's own flags are in ``options``, as the
dataclass the target declares (:attr:`partitioning.target.Target.options`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from families.definition import FamilyDefinition

DEFAULT_BATCH = 8  # sequences per micro-batch when neither --batch nor the target settles it


@dataclass(frozen=True)
class Request:
    family: str
    version: str
    target: str
    stages: int | None  # None until given or settled by the target (--target ipu: its IPUs)
    shape: str | None
    config: Path | None
    class_name: str | None
    granularity: str | int
    batch: int | None
    lengths: Mapping[str, int]
    micro_batches: int
    schedule: str  # lower case: a name of partitioning.schedules.SCHEDULES, or "auto"
    virtual_stages: int | None  # chunks per rank (None: the schedule's default)
    device_flops: float  # TFLOP/s
    bandwidth: float  # GB/s
    memory_gb: float | None
    optimizer_states: int
    master_weights: bool
    measure: int
    device: str
    memory_bandwidth: float  # GB/s
    recompute: bool
    calibration: Path | None
    calibrate: Path | None
    threads: int
    output: Path
    plot: Path | None
    module_to_device: str | None  # "-": print it
    run: bool
    run_steps: int
    options: Any  # the target's own flags, or None
    verbose: bool
    models_dir: Path | None = None  # where the generated code is (None: the repository's generated_models)
    timeline: Path | None = None  # with run: rank 0 writes the per-rank timeline of every step there
    tied_sum: str = "ordered"  # the run's sum of a tied weight's copies (partitioning.solve.costs.TIED_SUMS)

    def class_of(self, definition: FamilyDefinition) -> str:
        return self.class_name or definition.default_class

    def shape_of(self, definition: FamilyDefinition) -> str:
        """The shape as a plan records it: its name, or the config file it came from."""
        return self.shape or (str(self.config) if self.config else definition.default_shape)

    def reads(self) -> dict[str, Path | None]:
        """The files every target's command reads, by the flag that names them."""
        return {"--config": self.config, "--calibration": self.calibration}

    def writes(self) -> dict[str, Path]:
        """The files every target's plan writes, by the flag that names them."""
        paths = {"--output": self.output}
        if self.plot:
            paths["--plot"] = self.plot
        if self.module_to_device not in (None, "-"):
            paths["--module-to-device"] = Path(self.module_to_device)
        return paths
