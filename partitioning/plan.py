"""The plan: an ordered chain of blocks split into contiguous stages (the contract between
costing, the partitioner and every placement backend)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

from common.errors import UserError
from common.files import parse_json
from common.schema import (
    NON_EMPTY,
    Check,
    Count,
    NonNegative,
    OptionError,
    Text,
    Wording,
    fail,
    parse_options,
    show_repr,
)

# The plan file's fields are read by common.schema, with the annotations below as their schema, and worded so.
WORDING = Wording(unknown="{table} has an unknown field {name!r}", show=lambda value: show_repr(value, 40),
                  table="a JSON object")
Texts = Annotated[tuple[Text, ...], Check("a list of strings")]
NonEmptyTexts = Annotated[tuple[Text, ...], Check("a list of strings", NON_EMPTY.test)]


@dataclass(frozen=True)
class Block:
    """One candidate unit of a stage, in execution order.

    ``modules`` are the fully qualified names of the submodules the block runs
    (the first is where a stage starting at this block begins).  Costs are per
    micro-batch: forward FLOPs, parameter bytes (shared weights counted where
    they are first used), and the bytes of every tensor that crosses from this
    block to any later block (``out_bytes``): everything live across the cut
    right after this block, whether this block made it or only passes it on
    (``crossing`` describes each of those tensors).
    """

    name: Text
    modules: NonEmptyTexts
    flops: NonNegative
    param_bytes: Count
    out_bytes: Count
    activation_bytes: Count = 0  # saved for backward, per micro-batch
    seconds: NonNegative | None = None  # measured wall time, when asked for
    shared: Texts = ()  # names of shared weights this block uses
    crossing: Texts = ()  # "name: dtype[shape]" of each tensor counted in out_bytes

    @property
    def first_module(self) -> str:
        return self.modules[0]


def block_layers(block: Block, layer_lists: Sequence[str]) -> list[str]:
    """The layers ``block`` runs: its modules that are items of a layer list (the family's repeated layers)."""
    layers = []
    for module in block.modules:
        owner, _, index = module.rpartition(".")
        if owner in layer_lists and index.isdigit():
            layers.append(module)
    return layers


def layer_of(module: str, layer_lists: Sequence[str]) -> str | None:
    """The layer (item of a layer list) that ``module`` is or lies inside: a sub-layer's layer."""
    for layers in layer_lists:
        head, dot, rest = module.partition(layers + ".")
        index = rest.split(".")[0]
        if not head and dot and index.isdigit():
            return f"{layers}.{index}"
    return None


def value_key(module: str, dtype: str, shape: Sequence[int]) -> str:
    """How a backend finds a crossing value in its own trace: the module computing it, its dtype and shape."""
    return f"{module}:{dtype}{list(shape)}"


_Input = Annotated[tuple[Text, Count], Check("a [name, bytes] pair")]


@dataclass(frozen=True)
class Recompute:
    """What a receiving stage needs to recompute a crossing value instead of receiving it.

    The value's *slice* (the nodes computing it from parameters, buffers,
    constants and model inputs) is deterministic and can be replayed there.
    ``grad``: the value depends on trainable parameters, so its gradient
    must still reach them (the backend sends it back to the producing stage).
    """

    flops: NonNegative  # forward FLOPs of the slice
    bytes: Count  # bytes the slice writes (views excluded): its memory traffic
    params: Texts = ()  # parameters and buffers the slice reads
    param_bytes: Count = 0
    inputs: tuple[_Input, ...] = ()  # model inputs the slice reads, with their bytes
    grad: bool = False


@dataclass(frozen=True)
class Value:
    """A tensor live across at least one cut of the block chain (produced in one block, read in a later one)."""

    name: Text  # node name in the costing trace
    key: Text  # value_key(): module, dtype, shape
    bytes: Count
    produced: Count  # index of the block computing it (model inputs: 0)
    uses: Annotated[tuple[Count, ...], NON_EMPTY]  # indices of the blocks reading it, ascending
    recompute: Recompute | None = None  # None: must be sent (random, written in place, or not a single tensor)
    input: bool = False  # a model input carried through the pipeline

    @property
    def last_use(self) -> int:
        return self.uses[-1]

    def crosses(self, cut: int) -> bool:
        """Live across the cut right after block ``cut``."""
        return self.produced <= cut < self.last_use


@dataclass(frozen=True)
class Stage:
    index: Count
    blocks: NonEmptyTexts
    compute: NonNegative  # predicted seconds per micro-batch, forward + backward
    communication: NonNegative  # predicted seconds to send this stage's output
    memory_bytes: Count
    recompute: Texts = ()  # keys of the values this stage recomputes instead of receiving
    recompute_time: NonNegative = 0.0  # predicted seconds per micro-batch to recompute them
    send_bytes: Count | None = None  # bytes sent over the outgoing cut per micro-batch (None: plans before recompute)

    @property
    def cost(self) -> float:
        return self.compute + self.recompute_time + self.communication


@dataclass
class Plan:
    model: dict[str, Any]  # family, version, class, shape name, config used for costing
    blocks: list[Block]
    stages: list[Stage]
    settings: dict[str, Any] = field(default_factory=dict)  # bandwidth, memory limit, schedule...
    values: list[Value] = field(default_factory=list)  # every tensor crossing a cut of the chain
    recomputed: list[str] = field(default_factory=list)  # names of the values receiving stages recompute
    # The rank running each stage (a chunk, under a schedule running several per rank: settings.virtual_stages);
    # empty: stage s on rank s.  Settings.stages is the number of ranks.
    placement: list[int] = field(default_factory=list)
    prediction: dict[str, Any] = field(default_factory=dict)  # simulated step time, bubble, per-rank memory...

    @property
    def ranks(self) -> list[int]:
        """The rank of every stage."""
        return list(self.placement) or list(range(len(self.stages)))

    @property
    def bottleneck(self) -> float:
        return max(stage.cost for stage in self.stages)

    @property
    def loads(self) -> tuple[float, ...]:
        """The stage costs from the largest down: the partitioner minimizes them lexicographically (the bottleneck
        first, then the next-busiest stage...; :func:`partitioning.solve.split.min_max_split`)."""
        return tuple(sorted((stage.cost for stage in self.stages), reverse=True))

    @property
    def ideal(self) -> float:
        """Perfect balance of compute alone: the bound no contiguous split can beat."""
        return sum(stage.compute for stage in self.stages) / len(self.stages)

    @property
    def ratio(self) -> float:
        return self.bottleneck / self.ideal if self.ideal else float("inf")

    def stage_of(self, block_name: str) -> int:
        for stage in self.stages:
            if block_name in stage.blocks:
                return stage.index
        raise UserError(f"unknown block name {block_name!r}")

    def validate(self) -> None:
        """Every stage names known blocks, and the stages cover the chain once, in order."""
        known = [block.name for block in self.blocks]
        for stage in self.stages:
            for name in stage.blocks:
                if name not in known:
                    raise UserError(f"stage {stage.index} names unknown block {name!r}")
        if [s.index for s in self.stages] != list(range(len(self.stages))):
            raise UserError(f"stage indices must be 0..{len(self.stages) - 1}")
        listed = [name for stage in self.stages for name in stage.blocks]
        if listed != known or any(not stage.blocks for stage in self.stages):
            raise UserError("the stages must cover every block once, in chain order, with no empty stage")
        if self.placement and (len(self.placement) != len(self.stages)
                               or sorted(set(self.placement)) != list(range(max(self.placement) + 1))):
            raise UserError(f"the placement must give each of the {len(self.stages)} stages a rank, every rank "
                            f"0..N-1 used, got {self.placement}")

    def to_json(self) -> str:
        ratio = self.ratio
        data = {"model": self.model, "settings": self.settings,
                "blocks": [asdict(b) for b in self.blocks], "stages": [asdict(s) for s in self.stages],
                "values": [asdict(v) for v in self.values], "recomputed": list(self.recomputed),
                "placement": list(self.placement), "prediction": self.prediction,
                "bottleneck": self.bottleneck, "ideal": self.ideal,
                "ratio": ratio if math.isfinite(ratio) else None}  # JSON has no Infinity
        try:
            return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"
        except ValueError:
            raise UserError("the plan holds a number that is not finite (NaN or infinity): check the machine "
                            "settings it was made for") from None

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """A plan as :meth:`to_json` wrote it; anything else (a hand edit gone wrong) is one line naming the field."""
        try:
            data = parse_json(text)
        except ValueError as exc:
            raise UserError(f"not a plan file: {exc}") from None
        if isinstance(data, dict):  # bottleneck, ideal and ratio are derived; a newer release may write more
            data = {key: data[key] for key in PlanFile.__dataclass_fields__ if key in data}
        try:
            read = parse_options(PlanFile, data)
        except OptionError as error:
            raise fail(error, "not a plan file", WORDING) from None
        return cls(dict(read.model), list(read.blocks), list(read.stages), dict(read.settings), list(read.values),
                   list(read.recomputed), list(read.placement), dict(read.prediction))


_Table = Annotated[dict[str, Any], Check("a JSON object")]


@dataclass(frozen=True)
class PlanFile:
    """The schema of a plan file (:meth:`Plan.to_json`)."""

    model: _Table
    blocks: Annotated[tuple[Block, ...], Check("a non-empty list", NON_EMPTY.test)]
    stages: Annotated[tuple[Stage, ...], Check("a non-empty list", NON_EMPTY.test)]
    settings: _Table = field(default_factory=dict)
    values: tuple[Value, ...] = ()
    recomputed: Texts = ()
    placement: Annotated[tuple[Count, ...], Check("a list of ranks")] = ()
    prediction: _Table = field(default_factory=dict)
