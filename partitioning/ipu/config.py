"""The IPU config: what PopTorch needs beside the placement, as ``poptorch.Options`` or its options file.

Field names follow optimum-graphcore's ``IPUConfig`` where one exists
(``layers_per_ipu`` with ``-1`` wildcards, ``ipus_per_replica``...).  Both
outputs come from one list of setter calls (:meth:`IPUConfig.option_calls`),
so the options file and the programmatic ``poptorch.Options`` cannot drift.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from converter.atomic import write_atomic
from partitioning.ipu.errors import IPUError, require_poptorch

OUTPUT_MODES = {"all": "All", "sum": "Sum", "final": "Final", "default": "Default"}
INFERENCE_EXECUTIONS = ("sharded", "pipelined")


@dataclass(frozen=True)
class Ref:
    """``poptorch.<path>``, called with ``args`` when ``called``: an option value named, not built."""

    path: str
    args: tuple[Any, ...] = ()
    called: bool = False


@dataclass(frozen=True)
class TorchDtype:
    name: str  # an attribute of torch, e.g. "float16"


Call = tuple[str, tuple[Any, ...]]  # "Training.gradientAccumulation", (7,)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class IPUConfig:
    """How to run a placement: replication, batching, precision, memory, execution strategy.

    ``None`` for ``ipus_per_replica``, ``gradient_accumulation`` or
    ``device_iterations`` means "derive from the placement": the plan's IPU
    count and the least value PopTorch accepts for the pipeline (see
    :func:`partitioning.ipu.placement.place`).
    """

    training: bool = True
    ipus_per_replica: int | None = None
    replication_factor: int = 1
    device_iterations: int | None = None
    gradient_accumulation: int | None = None
    # Proportion of each IPU's memory matmuls and convolutions may use for temporaries; one value or one per IPU.
    available_memory_proportion: float | tuple[float, ...] = 0.6
    recompute_every_layer: bool = False  # checkpoint every layer's outputs but the last of each layer list
    recompute_checkpoints: tuple[str, ...] = ()  # plan block names whose outputs are checkpointed
    output_mode: str = "default"
    executable_cache_dir: str | None = None
    enable_half_partials: bool = False
    stochastic_rounding: bool = False
    layers_per_ipu: tuple[int, ...] | None = None  # manual layout overriding the plan's stages; -1: share the rest
    auto_round_num_ipus: bool = False
    inference_execution: str = "sharded"  # or "pipelined"
    # Re-split the plan's blocks knowing IPU 0 also runs the shared weight's later users (the LM head);
    # false keeps the plan's stages as they are.
    rebalance_shared: bool = True

    def __post_init__(self) -> None:
        for name in ("available_memory_proportion", "recompute_checkpoints", "layers_per_ipu"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        self._check()

    def _check(self) -> None:
        for name in ("training", "recompute_every_layer", "enable_half_partials", "stochastic_rounding",
                     "auto_round_num_ipus", "rebalance_shared"):
            if not isinstance(getattr(self, name), bool):
                raise IPUError(f"IPU config: {name} must be true or false, got {getattr(self, name)!r}")
        for name in ("ipus_per_replica", "replication_factor", "device_iterations", "gradient_accumulation"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and value >= 1):
                raise IPUError(f"IPU config: {name} must be a positive integer, got {value!r}")
        proportions = self.available_memory_proportion
        for value in proportions if isinstance(proportions, tuple) else (proportions,):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise IPUError(f"IPU config: available_memory_proportion values must be in (0, 1], got {value!r}")
        if self.output_mode not in OUTPUT_MODES:
            raise IPUError(f"IPU config: output_mode {self.output_mode!r} is not one of {', '.join(OUTPUT_MODES)}")
        if self.inference_execution not in INFERENCE_EXECUTIONS:
            raise IPUError(f"IPU config: inference_execution {self.inference_execution!r} is not one of "
                           f"{', '.join(INFERENCE_EXECUTIONS)}")
        if not all(isinstance(name, str) for name in self.recompute_checkpoints):
            raise IPUError("IPU config: recompute_checkpoints must list block names")
        if self.executable_cache_dir is not None and not isinstance(self.executable_cache_dir, str):
            raise IPUError("IPU config: executable_cache_dir must be a path string")
        if self.layers_per_ipu is not None and not (
                self.layers_per_ipu and all(_is_int(n) and n >= -1 for n in self.layers_per_ipu)):
            raise IPUError(f"IPU config: layers_per_ipu must list layer counts >= 0 or -1 (wildcard), "
                           f"got {list(self.layers_per_ipu)}")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "IPU config") -> IPUConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise IPUError(f"{source}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        return cls(**data)

    @classmethod
    def load(cls, path: Path) -> IPUConfig:
        """An IPU config from a JSON object of the fields above."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise IPUError(f"cannot read IPU config {path}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise IPUError(f"IPU config {path} is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise IPUError(f"IPU config {path} must be a JSON object of settings")
        return cls.from_dict(data, f"IPU config {path}")

    @property
    def pipelined(self) -> bool:
        return self.training or self.inference_execution == "pipelined"

    def memory_proportions(self, ipus: int) -> tuple[float, ...]:
        value = self.available_memory_proportion
        return value if isinstance(value, tuple) else (float(value),) * ipus

    def resolved(self, ipus: int, pipeline_stages: int) -> IPUConfig:
        """Derived values filled in: the least gradient accumulation / device iterations PopTorch accepts."""
        accumulation = self.gradient_accumulation
        iterations = self.device_iterations
        if accumulation is None:
            accumulation = 2 * pipeline_stages - 1 if self.training else 1
        if iterations is None:
            iterations = pipeline_stages if not self.training and self.pipelined else 1
        return replace(self, ipus_per_replica=self.ipus_per_replica or ipus,
                       gradient_accumulation=accumulation, device_iterations=iterations)

    def option_calls(self) -> list[Call]:
        """The ``poptorch.Options`` setter calls this config stands for, in the order they are made."""
        if self.ipus_per_replica is None or self.gradient_accumulation is None or self.device_iterations is None:
            raise IPUError("IPU config: ipus_per_replica, gradient_accumulation and device_iterations are not "
                           "known yet: build the options from a placement's config")
        auto = Ref("AutoStage.AutoIncrement")
        strategy = "PipelinedExecution" if self.pipelined else "ShardedExecution"
        calls: list[Call] = [
            ("autoRoundNumIPUs", (self.auto_round_num_ipus,)),
            ("replicationFactor", (self.replication_factor,)),
            ("deviceIterations", (self.device_iterations,)),
        ]
        if self.training:  # PopTorch: Training options must not be set for inference models
            calls.append(("Training.gradientAccumulation", (self.gradient_accumulation,)))
        calls += [
            # AutoIncrement: a fresh pipeline stage per block, so returning to IPU 0 for the LM head is legal.
            ("setExecutionStrategy", (Ref(strategy, (auto,), called=True),)),
            ("outputMode", (Ref(f"OutputMode.{OUTPUT_MODES[self.output_mode]}"),)),
            ("setAvailableMemoryProportion",
             ({f"IPU{i}": float(p) for i, p in enumerate(self.memory_proportions(self.ipus_per_replica))},)),
        ]
        if self.executable_cache_dir:
            calls.append(("enableExecutableCaching", (self.executable_cache_dir,)))
        calls.append(("Precision.enableStochasticRounding", (self.stochastic_rounding,)))
        if self.enable_half_partials:
            calls.append(("Precision.setPartialsType", (TorchDtype("float16"),)))
        return calls

    def to_poptorch_options(self) -> Any:
        """Real ``poptorch.Options`` for this config (needs the Poplar SDK)."""
        poptorch = require_poptorch()
        options = poptorch.Options()
        for path, args in self.option_calls():
            *owners, method = path.split(".")
            target = options
            for owner in owners:
                target = getattr(target, owner)
            getattr(target, method)(*(_resolve(arg, poptorch) for arg in args))
        return options

    def options_text(self, title: str) -> str:
        """The options in PopTorch's ``Options.loadFromFile`` format.

        PopTorch prefixes each non-comment line with ``options.`` and executes
        it with only ``poptorch`` and ``options`` in scope, hence the
        ``poptorch.`` prefixes and ``__import__("torch")`` for a dtype.
        """
        lines = [f"# {title}",
                 '# Load with: opts = poptorch.Options(); opts.loadFromFile("<this file>")']
        for path, args in self.option_calls():
            lines.append(f"{path}({', '.join(_render(arg) for arg in args)})")
        return "\n".join(lines) + "\n"

    def to_options_file(self, path: Path, title: str) -> None:
        write_atomic(path, self.options_text(title).encode("utf-8"))


def _resolve(value: Any, poptorch: Any) -> Any:
    if isinstance(value, Ref):
        target = poptorch
        for part in value.path.split("."):
            target = getattr(target, part)
        return target(*(_resolve(arg, poptorch) for arg in value.args)) if value.called else target
    if isinstance(value, TorchDtype):
        import torch  # only real options need it; planning and the options file do not

        return getattr(torch, value.name)
    return value


def _render(value: Any) -> str:
    if isinstance(value, Ref):
        name = f"poptorch.{value.path}"
        return f"{name}({', '.join(_render(arg) for arg in value.args)})" if value.called else name
    if isinstance(value, TorchDtype):
        return f'__import__("torch").{value.name}'
    return repr(value)  # bool, int, float, str and dicts of them read back as the same value
