"""The family definition: what every stage after conversion knows about a model family, read from its recipe.

Beside the converter's transforms, ``families/recipe_data/<family>.toml`` holds
three sections that the partitioner, the pipelining backend, the IPU target and
the benchmarks read (docs/families.md has the full schema and examples):

* ``[model]``: the config class, the default class and, per generated class,
  its one output (``"loss"`` marks a class that trains: given its label inputs,
  its forward returns its own loss) and ``base``, the path of the base model's
  modules inside the class (``"transformer"`` in a GPT-2 LM head model; empty
  where the class holds them itself).
* ``[pipeline]``: the named sequence lengths and their defaults, the inputs of one training micro-batch (shape
  in ``batch`` and those lengths, and how each is filled), and the block chain in execution order: fixed blocks
  (a name and the modules they run) and repeated layer lists (one block per item, with the sub-layers of an
  item).  A block applies to a class when its first module exists there.  Every layer list counts as layers for
  uniform splits and ``layers_per_ipu``.
* ``[shapes]``: named model sizes (config keyword arguments, with values common to all of them) and the default.

A target's own section (``[ipu]``: :mod:`partitioning.ipu.section`) is kept as the recipe gives it, in
:attr:`FamilyDefinition.sections`, for the target to read.  Shared weights are read off the recipe's own
``shared_weight`` step.  Every key is checked at load (:mod:`families.sections`): a misspelled or mistyped
one is a one-line :class:`UserError` naming the file and key.  No torch: the converter reads it first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from common.errors import UserError
from common.schema import OptionError, convert, fail, parse_options, read
from families.limits import LimitsSection
from families.sections import (
    BATCH,
    AbsentEntry,
    ArgumentName,
    ConfigFlag,
    DefinitionDocument,
    InputEntry,
    ModulePath,
    ModulePaths,
    ParameterName,
    PipelineSection,
    PlanEntry,
)

__all__ = ["BATCH", "LOSS", "ChainEntry", "ClassInfo", "FamilyDefinition", "InputSpec", "SharedWeight",
           "parse_definition"]

SECTIONS = ("model", "pipeline", "shapes")  # required
TARGET_SECTIONS = ("ipu",)  # optional, each read by its target
LOSS = "loss"  # the output of a class that trains


@dataclass(frozen=True)
class ClassInfo:
    """One generated class: its one output, and where its base model's modules are."""

    name: str
    output: str
    base: str = ""
    inputs: tuple[InputSpec, ...] = ()  # the inputs it takes in another form than the family's (by name)
    causal_lm: bool = False  # labels = input ids (next-token prediction): raw text can train it
    omit: tuple[str, ...] = ()  # family inputs it is not given (its forward makes them)

    @property
    def trains(self) -> bool:
        return self.output == LOSS

    def path(self, module: str, root: bool = False) -> str:
        """The path of a chain module in this class (``root``: already a path from the class itself)."""
        return module if root or not self.base else f"{self.base}.{module}"


@dataclass(frozen=True)
class ChainEntry:
    """A fixed block (``name``, ``modules``: the first starts it) or a layer list (``layers``: a block per item)."""

    name: str | None = None
    modules: tuple[str, ...] = ()
    layers: str | None = None
    sublayers: tuple[tuple[str, ...], ...] = ()  # per item, relative to it; a sub-layer applies when its first exists
    root: bool = False  # paths from the class itself, not from its base model
    optional: tuple[str, ...] = ()  # modules of the block a class may lack (the block is built without them)

    @property
    def start(self) -> str:
        """The module whose call starts this entry's first block."""
        return f"{self.layers}.0" if self.layers is not None else self.modules[0]


@dataclass(frozen=True)
class InputSpec:
    """One input of a training micro-batch.

    ``shape`` entries are ``"batch"``, a sequence-length name or a size.
    ``fill``: ``randint`` draws from ``[low, high)`` (each bound a number or a
    config attribute, e.g. ``"vocab_size"``), ``ones`` and ``zeros`` are
    constant (attention masks); ``last``, every sequence's last value (BART's ``</s>``).
    """

    name: str
    shape: tuple[str | int, ...]
    fill: str
    low: int | str = 0
    high: int | str | None = None
    dtype: str = "int64"
    last: int | str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {**asdict(self), "shape": list(self.shape)}
        for key in (("low", "high") if self.fill != "randint" else ()) + (("last",) if self.last is None else ()):
            del data[key]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str = "plan") -> InputSpec:
        """An input as :meth:`to_dict` wrote it (a plan file), checked like the recipe's."""
        values = dict(data)
        name = values.pop("name", None)
        try:
            name = convert(ArgumentName, name)
        except OptionError as error:
            raise fail(error.under("inputs[].name"), origin) from None
        try:
            return _input(name, parse_options(InputEntry, values))
        except OptionError as error:
            raise fail(error.under(f"inputs.{name}"), origin) from None


@dataclass(frozen=True)
class SharedWeight:
    """A weight several modules use, as the recipe's ``shared_weight`` step declares it for one class."""

    weight: str  # the top-level parameter of the stateless form (``make_stateless()``)
    module: str  # the module of the stateful form whose ``.weight`` it is
    users: tuple[str, ...]  # the modules that embed with it
    tied_linear: str | None = None  # a linear layer that also uses it, when tied
    tied_config: str | None = None  # the config attribute saying whether it is tied (none: always)

    def tied(self, config: Mapping[str, Any]) -> bool:
        if self.tied_linear is None:
            return False
        return self.tied_config is None or bool(config.get(self.tied_config, True))  # HF's configs tie by default


@dataclass(frozen=True)
class FamilyDefinition:
    family: str
    package: str
    config_class: str  # a class in ``package``'s top level
    default_class: str
    classes: dict[str, ClassInfo]
    lengths: dict[str, int]  # sequence-length name -> default
    inputs: tuple[InputSpec, ...]
    chain: tuple[ChainEntry, ...]
    shapes: dict[str, dict[str, Any]]  # name -> config keyword arguments (common values included)
    default_shape: str
    shared: dict[str, tuple[SharedWeight, ...]] = field(default_factory=dict)  # class -> its shared weights
    verify_shape: str = ""  # the shape convert-model's fx check builds (default: default_shape)
    limits: LimitsSection = field(default_factory=LimitsSection)  # what the models can take ([model.limits])
    # The targets' own sections, as the recipe gives them (TARGET_SECTIONS), and the recipe they come from.
    sections: Mapping[str, Any] = field(default_factory=dict)
    origin: str = ""
    # "pp_plan": the chain (empty until then) is read off a release's classes or chain_plans (families/pp_plan.py).
    chain_from: str | None = None
    chain_sublayers: tuple[tuple[str, ...], ...] = ()
    chain_plans: tuple[PlanEntry, ...] = ()
    absent_keys: tuple[AbsentEntry, ...] = ()  # shape keys older releases' configs lack ([[shapes.absent]])

    def __post_init__(self) -> None:
        if not self.verify_shape:
            object.__setattr__(self, "verify_shape", self.default_shape)

    @property
    def config_path(self) -> str:
        return f"{self.package}.{self.config_class}"

    def entries(self, class_name: str) -> tuple[ChainEntry, ...]:
        """The chain with every path made absolute for ``class_name`` (its base model prefixed)."""
        info = self.classes[class_name]
        if not self.chain:
            raise UserError(f"the {self.family} chain is read from a release's classes ({self.chain_from}): "
                            "use families.family.ModelFamily, which reads it")
        resolved = []
        for entry in self.chain:
            if entry.layers is not None:
                resolved.append(ChainEntry(layers=info.path(entry.layers, entry.root), sublayers=entry.sublayers,
                                           root=True))
            else:
                resolved.append(ChainEntry(name=entry.name, modules=tuple(info.path(m, entry.root) for m in entry.modules),
                                           root=True, optional=tuple(info.path(m, entry.root) for m in entry.optional)))
        return tuple(resolved)

    def class_inputs(self, class_name: str) -> tuple[InputSpec, ...]:
        """The family's inputs but those it omits, each replaced by the class's own of that name, then its others."""
        own, omit = {spec.name: spec for spec in self.classes[class_name].inputs}, self.classes[class_name].omit
        return tuple(own.pop(spec.name, spec) for spec in self.inputs if spec.name not in omit) + tuple(own.values())

    def layer_lists(self, class_name: str) -> tuple[str, ...]:
        """The module lists whose items count as layers (optimum-graphcore's ``layers_per_ipu``, uniform splits)."""
        return tuple(entry.layers for entry in self.entries(class_name) if entry.layers is not None)

    def block_starts(self, class_name: str) -> tuple[str, ...]:
        """The module starting each chain entry, in execution order (entries the class lacks included)."""
        return tuple(entry.start for entry in self.entries(class_name))


def _input(name: str, entry: InputEntry) -> InputSpec:
    return InputSpec(name, entry.shape, entry.fill, 0 if entry.low is None else entry.low, entry.high, entry.dtype,
                     entry.last)


def parse_definition(data: Mapping[str, Any], origin: str) -> FamilyDefinition | None:
    """The family definition of one recipe's data (``None`` when it has none: a converter-only recipe)."""
    where = f"recipe {origin}"
    targets = {name: data[name] for name in TARGET_SECTIONS if name in data}
    if not any(name in data for name in SECTIONS):
        if targets:
            raise UserError(f"{where}: [{next(iter(targets))}] belongs to a family definition: add "
                            f"[{'], ['.join(SECTIONS)}]")
        return None
    missing = [name for name in SECTIONS if name not in data]
    if missing:
        raise UserError(f"{where}: the family definition needs [{'], ['.join(SECTIONS)}]; [{missing[0]}] is missing")
    document = read(DefinitionDocument, {key: data[key] for key in ("family", "package", "classes", *SECTIONS)
                                         if key in data}, where)
    try:
        classes = _classes(document)
    except OptionError as error:
        raise fail(error, where) from None
    shapes_section = document.shapes
    shapes = {name: {**shapes_section.common, **values} for name, values in shapes_section.named.items()}
    return FamilyDefinition(document.family, document.package, document.model.config, document.model.default_class,
                            classes, dict(document.pipeline.lengths),
                            tuple(_input(name, entry) for name, entry in document.pipeline.inputs.items()),
                            _chain(document.pipeline), shapes, shapes_section.default,
                            _shared_weights(where, data.get("transforms", []), classes),
                            shapes_section.verify or shapes_section.default, document.model.limits, targets, origin,
                            document.pipeline.chain, document.pipeline.sublayers or (), document.pipeline.plans,
                            shapes_section.absent)


def _classes(document: DefinitionDocument) -> dict[str, ClassInfo]:
    """Every class the recipe generates, as [model.classes] describes it."""
    described = document.model.classes
    for name in described:
        if name not in document.classes:
            raise OptionError.unknown(f"model.classes.{name}", document.classes)
    for name in document.classes:
        if name not in described:
            raise OptionError(f"model.classes.{name}", "is missing (every class the recipe generates is described)",
                              sep=" ")
    if document.model.default_class not in described:
        raise OptionError("model.default_class", f"{document.model.default_class!r} is not one of the recipe's "
                                                 f"classes", sep=" ")
    return {name: ClassInfo(name, described[name].output, described[name].base,
                            tuple(_input(key, entry) for key, entry in described[name].inputs.items()),
                            described[name].causal_lm, described[name].omit)
            for name in document.classes}


def _chain(pipeline: PipelineSection) -> tuple[ChainEntry, ...]:
    return tuple(ChainEntry(layers=block.layers, sublayers=block.sublayers or (), root=block.root)
                 if block.layers is not None else
                 ChainEntry(name=block.name, modules=block.modules or (), root=block.root, optional=block.optional)
                 for block in pipeline.blocks)


def _shared_weights(where: str, steps: Any, classes: Mapping[str, ClassInfo]) -> dict[str, tuple[SharedWeight, ...]]:
    """Per class, the weights the recipe's ``shared_weight`` steps plumb: their users, tied linear and its flag.

    A step's ``models`` are the classes owning the weight (each with its ``shared`` module, ``users``
    and tied linear); its ``forwards`` only say how the weight travels inside them.  The converter checks
    the whole step against its transform's options; these are the keys read here.
    """
    def value(kind: Any, raw: object, key: str) -> Any:
        try:
            return convert(kind, raw)
        except OptionError as error:
            raise fail(error.under(key), where) from None

    found: dict[str, list[SharedWeight]] = {name: [] for name in classes}
    for index, step in enumerate(steps if isinstance(steps, list) else []):
        if not isinstance(step, dict) or step.get("name") != "shared_weight":
            continue
        at = f"transforms[{index}] (shared_weight):"
        weight = value(ParameterName, step.get("weight"), f"{at} weight")
        for class_name, options in value(dict[str, dict[str, Any]], step.get("models"), f"{at} models").items():
            if class_name not in classes:
                raise UserError(f"{where}: {at} models.{class_name} is not one of the recipe's classes")
            key = f"{at} models.{class_name}"
            tied_linear = value(ModulePath | None, options.get("tied_linear"), f"{key}.tied_linear")
            tied_when = value(ConfigFlag | None, options.get("tied_when"), f"{key}.tied_when")
            found[class_name].append(SharedWeight(
                weight, value(ModulePath, options.get("shared"), f"{key}.shared"),
                value(ModulePaths, options.get("users"), f"{key}.users"), tied_linear,
                tied_when.removeprefix("self.config.") if tied_linear is not None and tied_when else None))
    return {name: tuple(weights) for name, weights in found.items()}
