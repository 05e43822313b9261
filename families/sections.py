"""The schema of a recipe's family sections, ``[model]``, ``[pipeline]`` and ``[shapes]``, as the file spells them.

Each dataclass is read by :mod:`common.schema`: a misspelled, missing or mistyped key, at
any depth, is an :class:`OptionError` naming its dotted path.  Checks inside one table are
in its ``__post_init__``; checks across sections (an input's lengths, the default class
and shape) are :func:`families.definition.parse_definition`'s, or the document's (what a class omits).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from common.schema import NON_EMPTY, Check, OptionError, PositiveInt, pattern
from common.versions import VersionError, VersionRange
from families.limits import LimitsSection

BATCH = "batch"  # the batch dimension in an input's shape
_LENGTH = re.compile(r"[a-z][a-z0-9]*")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*")

Name = Annotated[str, pattern(IDENTIFIER, "a name")]
ArgumentName = Annotated[str, pattern(IDENTIFIER, "an argument name")]
ParameterName = Annotated[str, pattern(IDENTIFIER, "a parameter name")]
ConfigFlag = Annotated[str, Check("a config flag", lambda text: re.fullmatch(r"self\.config\.[A-Za-z_]\w*", text)
                                  is not None, must="read one config flag (self.config.NAME)")]
ModulePath = Annotated[str, pattern(_PATH, "a module path such as 'encoder.block'")]
ModulePaths = Annotated[tuple[ModulePath, ...], Check("a non-empty list of module paths", NON_EMPTY.test)]
Bound = int | Annotated[str, pattern(IDENTIFIER, "an integer or a config attribute name")]


def _config_value(value: Any) -> bool:
    def scalar(item: Any) -> bool:
        return isinstance(item, (str, int, bool)) or isinstance(item, float) and math.isfinite(item)
    return scalar(value) or isinstance(value, list) and all(scalar(item) for item in value)


ConfigValues = dict[Annotated[str, pattern(IDENTIFIER, "config attribute names")],
                    Annotated[Any, Check("a config value (string, number, boolean or a list of them)", _config_value)]]


# Aliases, not inline: an annotation is evaluated in its class's namespace, where a check could not see this module's.
_BasePath = Annotated[str, Check("a module path such as 'encoder.block'",
                                 lambda path: path == "" or _PATH.fullmatch(path) is not None)]


@dataclass(frozen=True)
class ModelSection:
    config: Annotated[str, pattern(IDENTIFIER, "a class name")]
    default_class: str
    classes: dict[str, ClassEntry]
    limits: LimitsSection = field(default_factory=LimitsSection)


@dataclass(frozen=True)
class InputEntry:
    """One input of ``[pipeline.inputs]`` (or of a plan file): its lengths are checked against the family's."""

    shape: Annotated[tuple[PositiveInt | str, ...], Check("a non-empty list", lambda shape: shape != ())]
    fill: Literal["randint", "ones", "zeros"]
    low: Bound | None = None
    high: Bound | None = None
    dtype: Literal["int64", "float32"] = "int64"
    last: Bound | None = None  # every sequence's last value (BART's </s>)

    def __post_init__(self) -> None:
        given = [key for key in ("low", "high") if getattr(self, key) is not None]
        if self.fill != "randint" and given:
            raise OptionError(given[0], 'is only for fill = "randint"', sep=" ")
        if self.fill == "randint" and self.high is None:
            raise OptionError("high", 'is missing (fill = "randint" draws from [low, high))', sep=" ")

    def check_lengths(self, lengths: dict[str, int]) -> None:
        for index, size in enumerate(self.shape):
            if isinstance(size, str) and size != BATCH and size not in lengths:
                raise OptionError(f"shape[{index}]", f"{size!r} is neither 'batch' nor a length of "
                                                     f"[pipeline.lengths] ({', '.join(lengths)})", sep=" ")


@dataclass(frozen=True)
class ClassEntry:
    output: Name
    base: _BasePath = ""
    # Inputs of this class that differ from [pipeline.inputs] (a classifier's labels), by name.
    inputs: dict[ArgumentName, InputEntry] = field(default_factory=dict)
    # Inputs of [pipeline.inputs] this class is not given (its forward makes them, as stock's does when absent).
    omit: tuple[ArgumentName, ...] = ()
    # A causal LM: it learns next-token prediction from labels = its input ids (train-model --text packs raw text).
    causal_lm: bool = False


@dataclass(frozen=True)
class BlockEntry:
    """A fixed block (``name`` and ``modules``) or a layer list (``layers``, with ``sublayers`` per item)."""

    name: Annotated[str, pattern(_PATH, "a block name")] | None = None
    modules: ModulePaths | None = None
    layers: ModulePath | None = None
    sublayers: Annotated[tuple[ModulePaths, ...], Check("a list of module lists")] | None = None
    root: bool = False
    # Modules of a fixed block that some releases' classes lack (GPT-2's loss module: a function from 4.51 on).
    optional: tuple[ModulePath, ...] = ()

    def __post_init__(self) -> None:
        if not set(self.optional) <= set((self.modules or ())[1:]):
            raise OptionError("optional", "names modules of the block after its first", sep=" ")
        if self.layers is not None:
            for key in ("name", "modules"):
                if getattr(self, key) is not None:
                    raise OptionError(key, "a layer list names its blocks by item (give name and modules, or layers)")
            return
        if self.sublayers is not None:
            raise OptionError("sublayers", "is only for a layer list (layers = ...)", sep=" ")
        for key in ("name", "modules"):
            if getattr(self, key) is None:
                raise OptionError(key, "is missing (a fixed block has a name and modules; a layer list has layers)",
                                  sep=" ")


def _is_range(text: str) -> bool:
    try:
        VersionRange.parse(text)
    except VersionError:
        return False
    return True


@dataclass(frozen=True)
class PlanEntry:
    """The pipeline plan of releases whose classes declare none (``chain = "pp_plan"``), as later ones declare it.

    ``base`` stands for the config class's ``base_model_pp_plan`` (the base model's modules in order),
    ``heads`` for the task classes' ``_pp_plan`` (modules of a class itself, after the base model's).
    """

    versions: Annotated[str, Check("a release range such as \"<4.47\"", _is_range)]
    base: ModulePaths
    heads: tuple[ModulePath, ...] = ()

    def covers(self, release: str) -> bool:
        return release in VersionRange.parse(self.versions)


@dataclass(frozen=True)
class AbsentEntry:
    """Shape keys that the config class of a range of releases does not take yet, and what its model does instead.

    ``equal``: the model acts as if the key had this value (a bias it does not have: false); ``quotient``:
    it derives the key as ``numerator // denominator`` (``head_dim`` from ``hidden_size`` and the heads).
    A shape whose value agrees is built without the key; one that disagrees is refused.
    """

    versions: Annotated[str, Check("a release range such as \"<4.47\"", _is_range)]
    equal: ConfigValues = field(default_factory=dict)
    quotient: dict[Name, Annotated[tuple[Name, Name], Check("[numerator, denominator]", lambda p: len(p) == 2)]] = \
        field(default_factory=dict)
    # a per-layer list the release derives from a period instead: [the period's key, the item of every period-th
    # layer] (Gemma 3 before layer_types: sliding_window_pattern k, layer i full when (i + 1) % k == 0)
    period: dict[Name, Annotated[tuple[Name, str], Check("[period key, item]", lambda p: len(p) == 2)]] = \
        field(default_factory=dict)

    def covers(self, release: str) -> bool:
        return release in VersionRange.parse(self.versions)


_LengthName = Annotated[str, pattern(_LENGTH, "lowercase letters and digits")]
# A length name becomes partition-model's --NAME-len; "seq" would clash with its --seq-len NAME=N.
_RESERVED_LENGTHS = (BATCH, "seq")


@dataclass(frozen=True)
class PipelineSection:
    lengths: dict[_LengthName, PositiveInt]
    inputs: dict[ArgumentName, InputEntry]
    blocks: tuple[BlockEntry, ...] = ()
    # The chain read off the source's own pipeline plan (families/pp_plan.py) instead of blocks, and
    # the sub-layers of each layer list it names (as a layer list's sublayers).
    chain: Literal["pp_plan"] | None = None
    sublayers: Annotated[tuple[ModulePaths, ...], Check("a list of module lists")] | None = None
    plans: tuple[PlanEntry, ...] = ()  # for chain = "pp_plan": the plan of releases whose classes declare none

    def __post_init__(self) -> None:
        if self.plans and self.chain is None:
            raise OptionError("plans", "is only for chain = \"pp_plan\" (the blocks are the chain)", sep=" ")
        if (self.chain is None) == (not self.blocks):
            raise OptionError("blocks", "give the block chain as [[pipeline.blocks]] or read it with chain = "
                                        "\"pp_plan\", one of them")
        if self.sublayers is not None and self.chain is None:
            raise OptionError("sublayers", "is only for chain = \"pp_plan\" (a layer list has its own)", sep=" ")
        for name in self.lengths:
            if name in _RESERVED_LENGTHS:
                raise OptionError("lengths", f"{name!r} is reserved (batch size / partition-model's --seq-len)")
        if not self.lengths:
            raise OptionError("lengths", "names no sequence length", sep=" ")
        if not self.inputs:
            raise OptionError("inputs", "names no input", sep=" ")
        for name, entry in self.inputs.items():
            try:
                entry.check_lengths(self.lengths)
            except OptionError as error:
                raise error.under(f"inputs.{name}") from None
        chained: set[str | None] = set()
        for index, block in enumerate(self.blocks):
            entry_name = block.layers or block.name
            if entry_name in chained:
                raise OptionError(f"blocks[{index}]", f"{entry_name!r} appears twice in the chain")
            chained.add(entry_name)


@dataclass(frozen=True)
class ShapesSection:
    default: str
    named: dict[str, ConfigValues]
    verify: str | None = None
    common: ConfigValues = field(default_factory=dict)
    absent: tuple[AbsentEntry, ...] = ()  # keys older releases' configs lack (AbsentEntry)

    def __post_init__(self) -> None:
        for key in ("default", "verify"):
            shape = getattr(self, key)
            if shape is not None and shape not in self.named:
                raise OptionError(key, f"{shape!r} is not one of shapes.named ({', '.join(self.named)})", sep=" ")


@dataclass(frozen=True)
class DefinitionDocument:
    """The keys of a recipe a family definition reads (the rest are the converter's)."""

    family: str
    package: str
    classes: tuple[str, ...]
    model: ModelSection
    pipeline: PipelineSection
    shapes: ShapesSection

    def __post_init__(self) -> None:
        for name, entry in self.model.classes.items():  # what a class omits is one of the family's inputs
            for key in (key for key in entry.omit if key not in self.pipeline.inputs):
                raise OptionError(f"model.classes.{name}.omit", f"names {key!r}, not one of [pipeline.inputs]",
                                  sep=" ")
