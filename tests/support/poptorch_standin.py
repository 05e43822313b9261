"""A STAND-IN for poptorch, which ships only with Graphcore's Poplar SDK and cannot be installed here.

It implements the documented semantics of the few entry points the IPU
target uses, and nothing else:

* ``BeginBlock(module, user_id, ipu_id)`` registers a forward pre-hook and
  returns the same module; annotating a module twice is an error.  The hook
  starts the block only while a stages manager is set (PopTorch sets one
  while it traces the model for the IPU): outside the IPU it is a no-op.
* ``removeBlocks(module)`` drops those hooks from every submodule.
* ``recomputationCheckpoint(tensor)`` returns its input (it only marks it on the IPU).
* ``serializedMatMul(lhs, rhs, mode, factor)`` is ``lhs @ rhs`` (serializing is a
  compilation directive: ``factor`` matmuls over ``mode``'s dimension on the IPU).
* ``TensorLocationSettings`` records its chained settings (``useOnChipStorage``,
  ``useReplicatedTensorSharding``); equal settings compare equal.
* ``Options`` accepts only the setters PopTorch documents that the target
  calls, records each call, and ``loadFromFile`` reads PopTorch's text format
  the way PopTorch does (each line prefixed with ``options.`` and executed
  with ``poptorch`` and ``options`` in scope).

:func:`ipu_tracing` plays the stages manager and records which block is
current, so a CPU forward shows where every module would run.  This proves
the annotation and option logic, not IPU execution, compilation or memory.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from stateless.torch_internals import forward_pre_hooks

# A block start as BeginBlock gives it: (user_id, ipu_id), either of which PopTorch lets the caller leave out.
Stage = tuple[str | None, int | None]


class Block:
    _stages_manager: Tracer | None = None  # set only while "tracing for the IPU"


@dataclass
class Tracer:
    """Records block starts, recomputation checkpoints and serialized matmuls, in the order the forward makes them."""

    starts: list[Stage] = field(default_factory=list)
    checkpoints: list[Stage | None] = field(default_factory=list)
    serialized: list[tuple[Stage | None, int]] = field(default_factory=list)  # (block, factor)

    @property
    def current(self) -> Stage | None:
        return self.starts[-1] if self.starts else None

    def beginStage(self, user_id: str | None, ipu_id: int | None) -> None:  # noqa: N802 (PopTorch's name)
        self.starts.append((user_id, ipu_id))


@contextmanager
def ipu_tracing() -> Iterator[Tracer]:
    tracer = Tracer()
    Block._stages_manager = tracer
    try:
        yield tracer
    finally:
        Block._stages_manager = None


class _BlockHook:
    def __init__(self, user_id: str | None, ipu_id: int | None) -> None:
        self.user_id, self.ipu_id = user_id, ipu_id

    def __call__(self, module: torch.nn.Module, inputs: Any) -> None:
        if Block._stages_manager is not None:
            Block._stages_manager.beginStage(self.user_id, self.ipu_id)


def BeginBlock(layer_to_call: torch.nn.Module, user_id: str | None = None,  # noqa: N802
               ipu_id: int | None = None) -> torch.nn.Module:
    if not isinstance(layer_to_call, torch.nn.Module):
        raise TypeError("module is not an instance of torch.nn.Module")
    if any(isinstance(hook, _BlockHook) for hook in forward_pre_hooks(layer_to_call).values()):
        raise RuntimeError("module has already been assigned to a block.")
    layer_to_call.register_forward_pre_hook(_BlockHook(user_id, ipu_id))
    return layer_to_call


def removeBlocks(module: torch.nn.Module) -> None:  # noqa: N802
    for m in module.modules():
        for key in [k for k, hook in forward_pre_hooks(m).items() if isinstance(hook, _BlockHook)]:
            del forward_pre_hooks(m)[key]


def recomputationCheckpoint(tensor: torch.Tensor) -> torch.Tensor:  # noqa: N802
    if Block._stages_manager is not None:
        Block._stages_manager.checkpoints.append(Block._stages_manager.current)
    return tensor


class MatMulSerializationMode(enum.Enum):
    InputChannels = "input_channels"
    ReducingDim = "reducing_dim"
    OutputChannels = "output_channels"
    Disabled = "none"


def serializedMatMul(lhs: torch.Tensor, rhs: torch.Tensor, mode: MatMulSerializationMode,  # noqa: N802
                     factor: int = 0, keep_precision: bool = False) -> torch.Tensor:
    if not isinstance(mode, MatMulSerializationMode):
        raise TypeError("mode must be a poptorch.MatMulSerializationMode")
    if Block._stages_manager is not None:
        Block._stages_manager.serialized.append((Block._stages_manager.current, factor))
    return torch.matmul(lhs, rhs)


class TensorLocationSettings:
    def __init__(self) -> None:
        self.settings: dict[str, Any] = {}

    def useOnChipStorage(self, use: bool = True) -> TensorLocationSettings:  # noqa: N802
        self.settings["onChip"] = bool(use)
        return self

    def useReplicatedTensorSharding(self, use: bool = True) -> TensorLocationSettings:  # noqa: N802
        self.settings["replicatedTensorSharding"] = bool(use)
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorLocationSettings) and self.settings == other.settings

    def __repr__(self) -> str:
        return f"TensorLocationSettings({self.settings})"


class AutoStage(enum.Enum):
    SameAsIpu = 0
    AutoIncrement = 1


class OutputMode(enum.Enum):
    Final = 0
    All = 1
    Sum = 2
    EveryN = 3
    Default = 4


@dataclass(frozen=True)
class PipelinedExecution:
    auto_stage: AutoStage = AutoStage.SameAsIpu


@dataclass(frozen=True)
class ShardedExecution:
    auto_stage: AutoStage = AutoStage.SameAsIpu


class _Setters:
    def __init__(self, prefix: str, calls: list[tuple[str, tuple[Any, ...]]], names: set[str]) -> None:
        self._prefix, self._calls, self._names = prefix, calls, names

    def __getattr__(self, name: str) -> Any:
        if name not in self._names:
            raise AttributeError(f"poptorch.Options has no setter {self._prefix}{name}")

        def setter(*args: Any) -> _Setters:
            self._calls.append((self._prefix + name, args))
            return self
        return setter


class Options(_Setters):
    def __init__(self) -> None:
        super().__init__("", [], {"autoRoundNumIPUs", "replicationFactor", "deviceIterations", "setExecutionStrategy",
                                  "outputMode", "setAvailableMemoryProportion", "enableExecutableCaching"})
        self.calls = self._calls
        self.Training = _Setters("Training.", self.calls, {"gradientAccumulation"})
        self.Precision = _Setters("Precision.", self.calls, {"enableStochasticRounding", "setPartialsType"})
        self.TensorLocations = _Setters("TensorLocations.", self.calls, {"setOptimizerLocation"})

    def loadFromFile(self, filepath: str) -> Options:  # noqa: N802
        commands = []
        with open(filepath) as handle:
            for line in handle:
                stripped = line.strip()
                if stripped and not stripped.startswith("#"):
                    commands.append("options." + stripped)
        exec("\n".join(commands), {}, {"poptorch": sys.modules[__name__], "options": self})
        return self
