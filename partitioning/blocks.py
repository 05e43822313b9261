"""Block chains and micro-batches of a generated model, made from its family's data (no family named here).

A family's chain (:class:`converter.family.ChainEntry`, paths already made
absolute for one class) becomes :class:`~partitioning.costing.BlockSpec` s:
a fixed block when its first module exists in the model, one block per item
of a layer list (``layers_per_block`` consecutive items grouped into one, or
each item's sub-layers as blocks of their own).  A micro-batch is the batch
size and the family's named sequence lengths; its inputs are filled as the
family's :class:`~converter.family.InputSpec` s say.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from converter.family import BATCH, ChainEntry, InputSpec
from partitioning.costing import BlockSpec
from partitioning.plan import PlanError

_DTYPES = {"int64": torch.long, "float32": torch.float32}


@dataclass(frozen=True)
class MicroBatch:
    """Sequences per micro-batch and the length of each of the family's named sequences."""

    batch: int
    lengths: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", dict(self.lengths))
        sizes = [self.batch, *self.lengths.values()]
        if not all(isinstance(size, int) and not isinstance(size, bool) for size in sizes) or min(sizes) < 1:
            raise PlanError(f"micro-batch sizes must be positive integers, got {self.describe()}")

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
            raise PlanError(f"the micro-batch has no sequence length {dimension!r} "
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
            raise PlanError(f"bad micro-batch {dict(data)!r}: {exc}") from None


def import_class(module: str, name: str, missing: str | None = None) -> type:
    """``module.name``: a generated model class or a config class (``missing``: the error if there is no module)."""
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module.startswith(exc.name):
            raise PlanError(missing or f"no module {module}") from None
        raise
    if not isinstance(found, type):
        raise PlanError(f"{module} has no class {name}")
    return found


def build_model(model_class: type, config: Any, device: str | torch.device = "meta") -> torch.nn.Module:
    """``model_class(config)`` in training mode, built directly on ``device`` (meta allocates nothing)."""
    try:
        with torch.device(device):
            return model_class(config).train()
    except Exception as exc:  # noqa: BLE001 (a config the model's code rejects fails any way: KeyError, RuntimeError...)
        detail = " ".join(str(exc).split())[:200]
        raise PlanError(f"cannot build {model_class.__name__} from this config: {type(exc).__name__}: {detail}") \
            from None


def _exists(model: torch.nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:  # missing, or an attribute that is not a module (BERT's pooler None)
        return False
    return True


def chain_specs(entries: Sequence[ChainEntry], model: torch.nn.Module, layers_per_block: int = 1,
                sublayers: bool = False) -> list[BlockSpec]:
    """The blocks of ``model``, in chain order: fixed blocks it has, its layer lists' items (grouped or split)."""
    if layers_per_block < 1:
        raise PlanError(f"granularity must be at least 1 layer per block, got {layers_per_block}")
    specs = []
    for entry in entries:
        if entry.layers is None:
            if not _exists(model, entry.modules[0]):
                continue  # this class has no such block (an encoder-only model's decoder)
            missing = [module for module in entry.modules[1:] if not _exists(model, module)]
            if missing:
                raise PlanError(f"block {entry.name!r}: the model has {entry.modules[0]} but no {missing[0]}")
            specs.append(BlockSpec(str(entry.name), entry.modules))
        elif _exists(model, entry.layers):
            count = len(model.get_submodule(entry.layers))  # type: ignore[arg-type]
            items = [f"{entry.layers}.{index}" for index in range(count)]
            if sublayers and entry.sublayers:
                specs += [BlockSpec(f"{item}.{sub[0]}", tuple(f"{item}.{module}" for module in sub))
                          for item in items for sub in entry.sublayers if _exists(model, f"{item}.{sub[0]}")]
                continue
            for first in range(0, count, layers_per_block):
                group = items[first:first + layers_per_block]
                name = group[0] if len(group) == 1 else f"{entry.layers}.{first}-{first + len(group) - 1}"
                specs.append(BlockSpec(name, tuple(group)))
    if not specs:
        raise PlanError("the model has none of its family's blocks")
    for entry in entries:
        layers = entry.layers
        if layers is not None and _exists(model, layers) and not len(model.get_submodule(layers)):  # type: ignore[arg-type]
            raise PlanError(f"the model's {layers} has no layers: check the config's layer counts")
    return specs


def accepted(specs: Sequence[InputSpec], forward: Callable[..., Any]) -> tuple[InputSpec, ...]:
    """The inputs a forward takes (an encoder-only class takes no decoder ids, a base model no labels)."""
    parameters = inspect.signature(forward).parameters
    return tuple(spec for spec in specs if spec.name in parameters)


def _bound(value: int | str | None, config: Any, name: str) -> int:
    if isinstance(value, int):
        return value
    found = getattr(config, str(value), None)
    if isinstance(found, bool) or not isinstance(found, int):
        raise PlanError(f"input {name}: the config has no integer {value!r}")
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
                raise PlanError(f"input {spec.name}: nothing to draw from [{low}, {high})")
            values[spec.name] = torch.randint(low, high, shape, generator=generator, dtype=dtype).to(device)
        else:
            values[spec.name] = (torch.ones if spec.fill == "ones" else torch.zeros)(shape, dtype=dtype, device=device)
    return values
