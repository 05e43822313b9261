"""The plan: an ordered chain of blocks split into contiguous stages (the contract between
costing, the partitioner and every placement backend)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from common.errors import UserError


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

    name: str
    modules: tuple[str, ...]
    flops: float
    param_bytes: int
    out_bytes: int
    activation_bytes: int = 0  # saved for backward, per micro-batch
    seconds: float | None = None  # measured wall time, when asked for
    shared: tuple[str, ...] = ()  # names of shared weights this block uses
    crossing: tuple[str, ...] = ()  # "name: dtype[shape]" of each tensor counted in out_bytes

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


@dataclass(frozen=True)
class Recompute:
    """What a receiving stage needs to recompute a crossing value instead of receiving it.

    The value's *slice* (the nodes computing it from parameters, buffers,
    constants and model inputs) is deterministic and can be replayed there.
    ``grad``: the value depends on trainable parameters, so its gradient
    must still reach them (the backend sends it back to the producing stage).
    """

    flops: float  # forward FLOPs of the slice
    bytes: int  # bytes the slice writes (views excluded): its memory traffic
    params: tuple[str, ...] = ()  # parameters and buffers the slice reads
    param_bytes: int = 0
    inputs: tuple[tuple[str, int], ...] = ()  # model inputs the slice reads, with their bytes
    grad: bool = False


@dataclass(frozen=True)
class Value:
    """A tensor live across at least one cut of the block chain (produced in one block, read in a later one)."""

    name: str  # node name in the costing trace
    key: str  # value_key(): module, dtype, shape
    bytes: int
    produced: int  # index of the block computing it (model inputs: 0)
    uses: tuple[int, ...]  # indices of the blocks reading it, ascending
    recompute: Recompute | None = None  # None: must be sent (random, written in place, or not a single tensor)
    input: bool = False  # a model input carried through the pipeline

    @property
    def last_use(self) -> int:
        return self.uses[-1]

    def crosses(self, cut: int) -> bool:
        """Live across the cut right after block ``cut``."""
        return self.produced <= cut < self.last_use

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Value:
        recompute = data.get("recompute")
        if recompute is not None:
            recompute = Recompute(**{**recompute, "params": tuple(recompute.get("params", ())),
                                     "inputs": tuple((str(n), int(b)) for n, b in recompute.get("inputs", ()))})
        return cls(**{**data, "uses": tuple(data["uses"]), "recompute": recompute})


@dataclass(frozen=True)
class Stage:
    index: int
    blocks: tuple[str, ...]
    compute: float  # predicted seconds per micro-batch, forward + backward
    communication: float  # predicted seconds to send this stage's output
    memory_bytes: int
    recompute: tuple[str, ...] = ()  # keys of the values this stage recomputes instead of receiving
    recompute_time: float = 0.0  # predicted seconds per micro-batch to recompute them
    send_bytes: int | None = None  # bytes sent over the outgoing cut per micro-batch (None: plans before recompute)

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

    @property
    def bottleneck(self) -> float:
        return max(stage.cost for stage in self.stages)

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

    def to_json(self) -> str:
        ratio = self.ratio
        data = {"model": self.model, "settings": self.settings,
                "blocks": [asdict(b) for b in self.blocks], "stages": [asdict(s) for s in self.stages],
                "values": [asdict(v) for v in self.values], "recomputed": list(self.recomputed),
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
            data = json.loads(text, parse_constant=_not_a_number)
        except ValueError as exc:
            raise UserError(f"not a plan file: {exc}") from None
        check = _Fields("plan")
        data = check.table(data, "", ("model", "blocks", "stages"))
        model = check.table(data["model"], "model")
        settings = check.table(data.get("settings", {}), "settings")
        blocks = []
        for index, raw in enumerate(check.items(data["blocks"], "blocks")):
            where = f"blocks[{index}]"
            raw = check.table(raw, where, ("name", "modules", "flops", "param_bytes", "out_bytes"))
            unknown = sorted(set(raw) - {f.name for f in fields(Block)})
            if unknown:
                raise UserError(f"not a plan file: {where} has an unknown field {unknown[0]!r}")
            seconds = raw.get("seconds")
            blocks.append(Block(
                name=check.text(raw["name"], f"{where}.name"), modules=check.texts(raw["modules"], f"{where}.modules"),
                flops=check.number(raw["flops"], f"{where}.flops"),
                param_bytes=check.count(raw["param_bytes"], f"{where}.param_bytes"),
                out_bytes=check.count(raw["out_bytes"], f"{where}.out_bytes"),
                activation_bytes=check.count(raw.get("activation_bytes", 0), f"{where}.activation_bytes"),
                seconds=None if seconds is None else check.number(seconds, f"{where}.seconds"),
                shared=check.texts(raw.get("shared", []), f"{where}.shared", empty=True),
                crossing=check.texts(raw.get("crossing", []), f"{where}.crossing", empty=True)))
        stages = []
        for index, raw in enumerate(check.items(data["stages"], "stages")):
            where = f"stages[{index}]"
            raw = check.table(raw, where, ("index", "blocks", "compute", "communication", "memory_bytes"))
            unknown = sorted(set(raw) - {f.name for f in fields(Stage)})
            if unknown:
                raise UserError(f"not a plan file: {where} has an unknown field {unknown[0]!r}")
            stages.append(Stage(index=check.count(raw["index"], f"{where}.index"),
                                blocks=check.texts(raw["blocks"], f"{where}.blocks"),
                                compute=check.number(raw["compute"], f"{where}.compute"),
                                communication=check.number(raw["communication"], f"{where}.communication"),
                                memory_bytes=check.count(raw["memory_bytes"], f"{where}.memory_bytes"),
                                recompute=check.texts(raw.get("recompute", []), f"{where}.recompute", empty=True),
                                recompute_time=check.number(raw.get("recompute_time", 0.0), f"{where}.recompute_time"),
                                send_bytes=None if raw.get("send_bytes") is None
                                else check.count(raw["send_bytes"], f"{where}.send_bytes")))
        values = [_value(check, raw, f"values[{index}]") for index, raw in enumerate(check.sequence(data.get("values", []),
                                                                                                 "values"))]
        recomputed = list(check.texts(data.get("recomputed", []), "recomputed", empty=True))
        return cls(model, blocks, stages, settings, values, recomputed)


def _value(check: _Fields, raw: Any, where: str) -> Value:
    raw = check.table(raw, where, ("name", "key", "bytes", "produced", "uses"))
    unknown = sorted(set(raw) - {f.name for f in fields(Value)})
    if unknown:
        raise UserError(f"not a plan file: {where} has an unknown field {unknown[0]!r}")
    recompute = raw.get("recompute")
    if recompute is not None:
        at = f"{where}.recompute"
        recompute = check.table(recompute, at, ("flops", "bytes"))
        unknown = sorted(set(recompute) - {f.name for f in fields(Recompute)})
        if unknown:
            raise UserError(f"not a plan file: {at} has an unknown field {unknown[0]!r}")
        inputs = []
        for index, pair in enumerate(check.sequence(recompute.get("inputs", []), f"{at}.inputs")):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise check.fail(f"{at}.inputs[{index}]", "a [name, bytes] pair", pair)
            inputs.append((check.text(pair[0], f"{at}.inputs[{index}][0]"),
                           check.count(pair[1], f"{at}.inputs[{index}][1]")))
        recompute = Recompute(flops=check.number(recompute["flops"], f"{at}.flops"),
                              bytes=check.count(recompute["bytes"], f"{at}.bytes"),
                              params=check.texts(recompute.get("params", []), f"{at}.params", empty=True),
                              param_bytes=check.count(recompute.get("param_bytes", 0), f"{at}.param_bytes"),
                              inputs=tuple(inputs), grad=check.flag(recompute.get("grad", False), f"{at}.grad"))
    uses = tuple(check.count(use, f"{where}.uses[{i}]") for i, use in enumerate(check.items(raw["uses"], f"{where}.uses")))
    return Value(name=check.text(raw["name"], f"{where}.name"), key=check.text(raw["key"], f"{where}.key"),
                 bytes=check.count(raw["bytes"], f"{where}.bytes"),
                 produced=check.count(raw["produced"], f"{where}.produced"), uses=uses, recompute=recompute,
                 input=check.flag(raw.get("input", False), f"{where}.input"))


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class _Fields:
    """Typed reads of a plan file: each failure names the field, the way a user would look for it."""

    def __init__(self, what: str) -> None:
        self.what = what

    def fail(self, where: str, expected: str, value: Any) -> UserError:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        return UserError(f"not a {self.what} file: {where or 'the top level'} must be {expected}, got {shown}")

    def table(self, value: Any, where: str, required: Sequence[str] = ()) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, "a JSON object", value)
        for key in required:
            if key not in value:
                raise UserError(f"not a {self.what} file: {where + '.' if where else ''}{key} is missing")
        return value

    def items(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list) or not value:
            raise self.fail(where, "a non-empty list", value)
        return value

    def sequence(self, value: Any, where: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(where, "a list", value)
        return value

    def flag(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, "true or false", value)
        return value

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(where, "a non-empty string", value)
        return value

    def texts(self, value: Any, where: str, empty: bool = False) -> tuple[str, ...]:
        if not isinstance(value, list) or not (value or empty):
            raise self.fail(where, "a list of strings", value)
        return tuple(self.text(item, f"{where}[{i}]") for i, item in enumerate(value))

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise self.fail(where, "a finite number >= 0", value)
        return float(value)

    def count(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(where, "an integer >= 0", value)
        return value
