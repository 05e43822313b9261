"""Building a generated model and its micro-batches from its family's data (no family named here).

A micro-batch is the batch size and the family's named sequence lengths; its
inputs are filled as the family's :class:`~families.definition.InputSpec` s say.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from common.errors import UserError
from families.definition import BATCH, InputSpec

_DTYPES = {"int64": torch.long, "float32": torch.float32}


@runtime_checkable
class SharedWeight(Protocol):
    """A generated model owning a shared weight: the shared_weight transform gives it a stateless form."""

    def make_stateless(self) -> torch.nn.Module: ...


@dataclass(frozen=True)
class MicroBatch:
    """Sequences per micro-batch and the length of each of the family's named sequences."""

    batch: int
    lengths: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", dict(self.lengths))
        sizes = [self.batch, *self.lengths.values()]
        if not all(isinstance(size, int) and not isinstance(size, bool) for size in sizes) or min(sizes) < 1:
            raise UserError(f"micro-batch sizes must be positive integers, got {self.describe()}")

    def scaled(self, factor: int) -> MicroBatch:
        """The whole batch of ``factor`` micro-batches."""
        return MicroBatch(self.batch * factor, self.lengths)

    def size(self, dimension: str | int) -> int:
        if isinstance(dimension, int):
            return dimension
        if dimension == BATCH:
            return self.batch
        try:
            return self.lengths[dimension]
        except KeyError:
            raise UserError(f"the micro-batch has no sequence length {dimension!r} "
                            f"(it has: {', '.join(self.lengths) or 'none'})") from None

    def describe(self) -> str:
        return f"{self.batch} x " + ", ".join(f"{name} {size}" for name, size in self.lengths.items())

    def to_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "lengths": dict(self.lengths)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MicroBatch:
        try:
            return cls(data["batch"], data["lengths"])
        except (KeyError, TypeError) as exc:
            raise UserError(f"bad micro-batch {dict(data)!r}: {exc}") from None


def import_class(module: str, name: str, missing: str | None = None) -> type:
    """``module.name``: a generated model class or a config class (``missing``: the error if there is no module)."""
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            raise UserError(missing or f"no module {module}") from None
        raise
    if not isinstance(found, type):
        raise UserError(f"{module} has no class {name}")
    return found


def build_model(model_class: type, config: Any, device: str | torch.device = "meta") -> torch.nn.Module:
    """``model_class(config)`` in training mode, built directly on ``device`` (meta allocates nothing)."""
    try:
        with torch.device(device):
            return model_class(config).train()
    except Exception as exc:  # noqa: BLE001 (a config the model's code rejects fails any way: KeyError, RuntimeError...)
        detail = " ".join(str(exc).split())[:200]
        raise UserError(f"cannot build {model_class.__name__} from this config: {type(exc).__name__}: {detail}") \
            from None


def accepted(specs: Sequence[InputSpec], forward: Callable[..., Any]) -> tuple[InputSpec, ...]:
    """The inputs a forward takes (an encoder-only class takes no decoder ids, a base model no labels)."""
    parameters = inspect.signature(forward).parameters
    return tuple(spec for spec in specs if spec.name in parameters)


def _bound(value: int | str | None, config: Any, name: str) -> int:
    if isinstance(value, int):
        return value
    found = getattr(config, str(value), None)
    if isinstance(found, bool) or not isinstance(found, int):
        raise UserError(f"input {name}: the config has no integer {value!r}")
    return found


def make_inputs(specs: Sequence[InputSpec], config: Any, micro_batch: MicroBatch, device: str | torch.device,
                seed: int = 0) -> dict[str, torch.Tensor]:
    """One micro-batch of synthetic inputs, drawn in ``specs`` order from one seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    values = {}
    for spec in specs:
        shape = tuple(micro_batch.size(dimension) for dimension in spec.shape)
        dtype = _DTYPES[spec.dtype]
        if spec.fill == "randint":
            low, high = _bound(spec.low, config, spec.name), _bound(spec.high, config, spec.name)
            if low >= high:
                raise UserError(f"input {spec.name}: nothing to draw from [{low}, {high})")
            values[spec.name] = torch.randint(low, high, shape, generator=generator, dtype=dtype).to(device)
        else:
            values[spec.name] = (torch.ones if spec.fill == "ones" else torch.zeros)(shape, dtype=dtype, device=device)
        if spec.last is not None:
            values[spec.name][..., -1] = _bound(spec.last, config, spec.name)
    return values
