"""The IPU config: what PopTorch needs beside the placement, as ``poptorch.Options`` or its options file.

Field names follow optimum-graphcore's ``IPUConfig`` where one exists
(``layers_per_ipu`` with ``-1`` wildcards, ``ipus_per_replica``...).  Both
outputs come from one list of setter calls (:meth:`IPUConfig.option_calls`),
so the options file and the programmatic ``poptorch.Options`` cannot drift.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from common.errors import UserError
from common.files import read_json_object
from common.generated import literal_text
from common.schema import Check, OptionError, PositiveInt, Proportion, Wording, convert, fail, read, show_json
from partitioning.ipu.errors import IPUError, require_poptorch

OUTPUT_MODES = {"all": "All", "sum": "Sum", "final": "Final", "default": "Default"}  # as IPUConfig.output_mode
_MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class Ref:
    """``poptorch.<path>``, called with ``args`` when ``called``, then ``.method(*args)`` for each of ``chain``:
    an option value named, not built."""

    path: str
    args: tuple[Any, ...] = ()
    called: bool = False
    chain: tuple[tuple[str, tuple[Any, ...]], ...] = ()


@dataclass(frozen=True)
class TorchDtype:
    name: str  # an attribute of torch, e.g. "float16"


Call = tuple[str, tuple[Any, ...]]  # "Training.gradientAccumulation", (7,)


_COUNTS = "layer counts >= 0 or -1 (wildcard)"
# A JSON user reads the values back as JSON spells them; the config's keys are one level deep.
_WORDING = Wording(show=show_json)


def _one_block(value: Any) -> str:
    return f" (one block: [{show_json(value)}])" if isinstance(value, str) else ""


@dataclass(frozen=True)
class IPUConfig:
    """How to run a placement: replication, batching, precision, memory, execution strategy.

    ``None`` for ``ipus_per_replica``, ``gradient_accumulation`` or
    ``device_iterations`` means "derive from the placement": the plan's IPU
    count and the least value PopTorch accepts for the pipeline (see
    :func:`partitioning.ipu.placement.place`).  ``micro_batch_size`` is the
    micro-batch the plan is costed for (``None``: whatever the plan says).
    The precision, optimizer and serialization fields are what the memory
    model (:mod:`partitioning.ipu.memory`) assumes about training.
    """

    training: bool = True
    ipus_per_replica: PositiveInt | None = None
    replication_factor: PositiveInt = 1
    device_iterations: PositiveInt | None = None
    gradient_accumulation: PositiveInt | None = None
    micro_batch_size: PositiveInt | None = None
    # Proportion of each IPU's memory matmuls and convolutions may use for temporaries (a cap PopLibs plans
    # within, not a reservation); one value or one per IPU.
    available_memory_proportion: Annotated[Proportion | tuple[Proportion, ...], Check(
        "a number in (0, 1] or a list of them", lambda value: value != ())] = 0.6
    recompute_every_layer: bool = False  # checkpoint every layer's outputs but the last of each layer list
    # plan block names whose outputs are checkpointed
    recompute_checkpoints: Annotated[tuple[str, ...], Check("a list of block names", hint=_one_block)] = ()
    output_mode: Literal["all", "sum", "final", "default"] = "default"
    executable_cache_dir: Annotated[str, Check("a path string")] | None = None
    half_precision: bool = True  # weights and activations in float16 (model.half()), as optimum-graphcore trains
    enable_half_partials: bool = False
    enable_half_first_order_momentum: bool = True  # the optimizer's first moment (and accumulators) in float16
    optimizer_state_offchip: bool = False  # optimizer state in streaming memory instead of on chip
    replicated_tensor_sharding: bool = False  # optimizer state sharded across replicas (with replication > 1)
    embedding_serialization_factor: PositiveInt = 1  # the vocabulary projection as this many serialized matmuls
    stochastic_rounding: bool = True  # optimum-graphcore enables it for every training run
    # manual layout overriding the plan's stages; -1: share the rest
    layers_per_ipu: Annotated[tuple[int, ...], Check(_COUNTS, lambda counts: counts != () and min(counts) >= -1,
                                                     must=f"list {_COUNTS}")] | None = None
    auto_round_num_ipus: bool = False
    inference_execution: Literal["sharded", "pipelined"] = "sharded"
    # Re-split the plan's blocks knowing IPU 0 also runs the shared weight's later users (the LM head);
    # false keeps the plan's stages as they are.
    rebalance_shared: bool = True

    def __post_init__(self) -> None:
        # Built in code (not read by from_dict): the same schema, field by field.
        hints = typing.get_type_hints(IPUConfig, include_extras=True)
        for item in fields(self):
            try:
                convert(hints[item.name], getattr(self, item.name))
            except OptionError as error:
                raise fail(error.under(item.name), "IPU config", _WORDING, IPUError) from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "IPU config",
                  defaults: Mapping[str, Any] | None = None) -> IPUConfig:
        """The config ``data`` sets, the rest from ``defaults`` (a family's ``[ipu]`` section) and the fields'."""
        values = {**(defaults or {}), **data}
        if any(values.get(name, 1) is None for name in ("replication_factor", "embedding_serialization_factor")):
            # null, which means "derive it from the placement" for the other counts, has no meaning here
            raise IPUError(f"{source}: replication_factor and embedding_serialization_factor must be positive "
                           f"integers, got null")
        return read(cls, values, source, _WORDING, IPUError)

    @classmethod
    def load(cls, path: Path, defaults: Mapping[str, Any] | None = None) -> IPUConfig:
        """An IPU config from a JSON object of the fields above (read capped), over ``defaults``."""
        try:
            data = read_json_object(path, "IPU config", _MAX_CONFIG_BYTES)
        except IPUError:
            raise
        except UserError as exc:
            raise IPUError(str(exc)) from None
        return cls.from_dict(data, f"IPU config {path}", defaults)

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
            # Where the optimizer state lives, as optimum-graphcore sets it (sharding needs replicas to shard over).
            location = Ref("TensorLocationSettings", called=True, chain=(
                ("useOnChipStorage", (not self.optimizer_state_offchip,)),
                ("useReplicatedTensorSharding", (self.replicated_tensor_sharding and self.replication_factor > 1,))))
            calls.append(("TensorLocations.setOptimizerLocation", (location,)))
        calls += [
            # AutoIncrement: a fresh pipeline stage per block, so returning to IPU 0 for the LM head is legal.
            ("setExecutionStrategy", (Ref(strategy, (auto,), called=True),)),
            ("outputMode", (Ref(f"OutputMode.{OUTPUT_MODES[self.output_mode]}"),)),
            ("setAvailableMemoryProportion",
             ({f"IPU{i}": float(p) for i, p in enumerate(self.memory_proportions(self.ipus_per_replica))},)),
        ]
        if self.executable_cache_dir:
            calls.append(("enableExecutableCaching", (self.executable_cache_dir,)))
        calls.append(("Precision.enableStochasticRounding", (self.stochastic_rounding and self.training,)))
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
        lines = [f"# {literal_text(title)}",
                 '# Load with: opts = poptorch.Options(); opts.loadFromFile("<this file>")']
        for path, args in self.option_calls():
            lines.append(f"{path}({', '.join(_render(arg) for arg in args)})")
        return "\n".join(lines) + "\n"


def _resolve(value: Any, poptorch: Any) -> Any:
    if isinstance(value, Ref):
        target = poptorch
        for part in value.path.split("."):
            target = getattr(target, part)
        if value.called:
            target = target(*(_resolve(arg, poptorch) for arg in value.args))
        for method, args in value.chain:
            target = getattr(target, method)(*(_resolve(arg, poptorch) for arg in args))
        return target
    if isinstance(value, TorchDtype):
        import torch  # only real options need it; planning and the options file do not

        return getattr(torch, value.name)
    return value


def _render(value: Any) -> str:
    if isinstance(value, Ref):
        text = f"poptorch.{value.path}"
        if value.called:
            text += f"({', '.join(_render(arg) for arg in value.args)})"
        return text + "".join(f".{method}({', '.join(_render(arg) for arg in args)})" for method, args in value.chain)
    if isinstance(value, TorchDtype):
        return f'__import__("torch").{value.name}'
    return repr(value)  # bool, int, float, str and dicts of them read back as the same value
