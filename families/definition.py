"""The family definition: what every stage after conversion knows about a model family, read from its recipe.

Beside the converter's transforms, ``families/recipe_data/<family>.toml`` holds
three sections that the partitioner, the pipelining backend, the IPU target and
the benchmarks read (docs/families.md has the full schema and examples):

* ``[model]``: the config class, the default class and, per generated class,
  its one output (``"loss"`` marks a class that trains: given its label inputs,
  its forward returns its own loss) and ``base``, the path of the base model's
  modules inside the class (``"transformer"`` in a GPT-2 LM head model; empty
  where the class holds them itself).
* ``[pipeline]``: the named sequence lengths and their defaults, the inputs of
  one training micro-batch (shape in ``batch`` and those lengths, and how each
  is filled), and the block chain in execution order: fixed blocks (a name and
  the modules they run) and repeated layer lists (one block per item, with the
  sub-layers of an item).  A block applies to a class when its first module
  exists there.  Every layer list counts as layers for uniform splits and
  ``layers_per_ipu``.
* ``[shapes]``: named model sizes (config keyword arguments, with values common
  to all of them) and the default one.
* ``[ipu]`` (optional): how the family is trained on Graphcore IPUs, as
  optimum-graphcore's published IPU configuration for it sets up training
  (IPU count, micro-batch, precision, recomputation, optimizer-state
  location, embedding serialization, matmul memory proportion): the defaults
  of ``partition-model --target ipu``; and ``[ipu.published.<shape>]``, the
  published ``layers_per_ipu`` layouts partition-model prints beside its own.

Shared weights are not restated here: :func:`parse_definition` reads them off
the recipe's own ``shared_weight`` step.  Every key is checked at load: a
misspelled or mistyped one is a one-line :class:`UserError` naming the file
and the key.  Stdlib only, like the rest of the converter.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from common.errors import UserError

SECTIONS = ("model", "pipeline", "shapes")  # required; [ipu] is optional
LOSS = "loss"  # the output of a class that trains
BATCH = "batch"  # the batch dimension in an input's shape
FILLS = ("randint", "ones", "zeros")
DTYPES = ("int64", "float32")
# A length name becomes partition-model's --NAME-len; "seq" would clash with its --seq-len NAME=N.
_RESERVED_LENGTHS = (BATCH, "seq")
_LENGTH = re.compile(r"[a-z][a-z0-9]*\Z")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*\Z")
_CONFIG_FLAG = re.compile(r"self\.config\.([A-Za-z_][A-Za-z0-9_]*)\Z")
# [ipu] keys and their kinds: the IPU config fields a family may default (partitioning/ipu/config.py).
IPU_DEFAULTS = {
    "ipus_per_replica": "positive",
    "micro_batch_size": "positive",
    "available_memory_proportion": "proportion",
    "recompute_every_layer": "boolean",
    "embedding_serialization_factor": "positive",
    "enable_half_partials": "boolean",
    "enable_half_first_order_momentum": "boolean",
    "half_precision": "boolean",
    "optimizer_state_offchip": "boolean",
    "replicated_tensor_sharding": "boolean",
    "stochastic_rounding": "boolean",
}


@dataclass(frozen=True)
class ClassInfo:
    """One generated class: its one output, and where its base model's modules are."""

    name: str
    output: str
    base: str = ""

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
    constant (attention masks).
    """

    name: str
    shape: tuple[str | int, ...]
    fill: str
    low: int | str = 0
    high: int | str | None = None
    dtype: str = "int64"

    def to_dict(self) -> dict[str, Any]:
        data = {**asdict(self), "shape": list(self.shape)}
        if self.fill != "randint":
            del data["low"], data["high"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], origin: str = "plan") -> InputSpec:
        """An input as :meth:`to_dict` wrote it (a plan file), checked like the recipe's."""
        values = dict(data)
        name = values.pop("name", None)
        reader = _Reader(origin)
        return reader.input(reader.string(name, "inputs[].name", _IDENTIFIER, "an argument name"), values,
                            f"inputs.{name}", lengths=None)


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
        # HF's PretrainedConfig ties by default (tie_word_embeddings=True).
        return self.tied_config is None or bool(config.get(self.tied_config, True))


@dataclass(frozen=True)
class PublishedLayout:
    """A ``layers_per_ipu`` layout someone published for one shape (optimum-graphcore's hub configs)."""

    shape: str
    ipus: int
    layers_per_ipu: tuple[int, ...]
    source: str  # where it was published


@dataclass(frozen=True)
class IPUSection:
    """The ``[ipu]`` section: IPU config defaults (keys of :data:`IPU_DEFAULTS`) and published layouts."""

    defaults: dict[str, Any] = field(default_factory=dict)
    published: dict[str, PublishedLayout] = field(default_factory=dict)  # by shape name


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
    ipu: IPUSection = field(default_factory=IPUSection)
    verify_shape: str = ""  # the shape convert-model's fx check builds (default: default_shape)

    def __post_init__(self) -> None:
        if not self.verify_shape:
            object.__setattr__(self, "verify_shape", self.default_shape)

    @property
    def config_path(self) -> str:
        return f"{self.package}.{self.config_class}"

    def entries(self, class_name: str) -> tuple[ChainEntry, ...]:
        """The chain with every path made absolute for ``class_name`` (its base model prefixed)."""
        info = self.classes[class_name]
        resolved = []
        for entry in self.chain:
            if entry.layers is not None:
                resolved.append(ChainEntry(layers=info.path(entry.layers, entry.root), sublayers=entry.sublayers,
                                           root=True))
            else:
                resolved.append(ChainEntry(name=entry.name, modules=tuple(info.path(m, entry.root)
                                                                           for m in entry.modules), root=True))
        return tuple(resolved)

    def layer_lists(self, class_name: str) -> tuple[str, ...]:
        """The module lists whose items count as layers (optimum-graphcore's ``layers_per_ipu``, uniform splits)."""
        return tuple(entry.layers for entry in self.entries(class_name) if entry.layers is not None)

    def block_starts(self, class_name: str) -> tuple[str, ...]:
        """The module starting each chain entry, in execution order (entries the class lacks included)."""
        return tuple(entry.start for entry in self.entries(class_name))


class _Reader:
    """Typed reads of recipe data: every failure is one line naming the file and the key."""

    def __init__(self, origin: str) -> None:
        self.origin = origin

    def fail(self, message: str) -> UserError:
        return UserError(f"{self.origin}: {message}")

    def table(self, value: Any, where: str, known: Iterable[str], required: Iterable[str] = ()) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(f"{where} must be a table, got {type(value).__name__}")
        known = tuple(known)
        for key in value:
            if key not in known:
                raise self.fail(f"unknown key {_join(where, key)!r} (known there: {', '.join(sorted(known))})")
        for key in required:
            if key not in value:
                raise self.fail(f"{_join(where, key)} is missing")
        return value

    def string(self, value: Any, where: str, pattern: re.Pattern[str] | None = None, what: str = "a string") -> str:
        if not isinstance(value, str) or (pattern is not None and not pattern.match(value)):
            raise self.fail(f"{where} must be {what}, got {value!r}")
        return value

    def path(self, value: Any, where: str) -> str:
        return self.string(value, where, _PATH, "a module path such as 'encoder.block'")

    def paths(self, value: Any, where: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not value:
            raise self.fail(f"{where} must be a non-empty list of module paths, got {value!r}")
        return tuple(self.path(item, f"{where}[{index}]") for index, item in enumerate(value))

    def positive(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(f"{where} must be a positive integer, got {value!r}")
        return value

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(f"{where} must be true or false, got {value!r}")
        return value

    def input(self, name: str, data: Any, where: str, lengths: Mapping[str, int] | None) -> InputSpec:
        data = self.table(data, where, ("shape", "fill", "low", "high", "dtype"), ("shape", "fill"))
        shape = data["shape"]
        if not isinstance(shape, list) or not shape:
            raise self.fail(f"{where}.shape must be a non-empty list, got {shape!r}")
        for index, size in enumerate(shape):
            if isinstance(size, str):
                known = lengths is None or size == BATCH or size in lengths
                if not known:
                    raise self.fail(f"{where}.shape[{index}] {size!r} is neither 'batch' nor a length of "
                                    f"[pipeline.lengths] ({', '.join(lengths or ())})")
            else:
                self.positive(size, f"{where}.shape[{index}]")
        fill = data["fill"]
        if fill not in FILLS:
            raise self.fail(f"{where}.fill must be one of {', '.join(FILLS)}, got {fill!r}")
        dtype = data.get("dtype", "int64")
        if dtype not in DTYPES:
            raise self.fail(f"{where}.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        bounds = {key: data[key] for key in ("low", "high") if key in data and data[key] is not None}
        if fill != "randint" and bounds:
            raise self.fail(f"{_join(where, next(iter(bounds)))} is only for fill = \"randint\"")
        if fill == "randint" and "high" not in bounds:
            raise self.fail(f"{where}.high is missing (fill = \"randint\" draws from [low, high))")
        for key, bound in bounds.items():
            if isinstance(bound, str):
                self.string(bound, f"{where}.{key}", _IDENTIFIER, "an integer or a config attribute name")
            elif isinstance(bound, bool) or not isinstance(bound, int):
                raise self.fail(f"{where}.{key} must be an integer or a config attribute name, got {bound!r}")
        return InputSpec(name, tuple(shape), fill, bounds.get("low", 0), bounds.get("high"), dtype)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def parse_definition(data: Mapping[str, Any], origin: str) -> FamilyDefinition | None:
    """The family definition of one recipe's data (``None`` when it has none: a converter-only recipe)."""
    present = [name for name in SECTIONS if name in data]
    reader = _Reader(f"recipe {origin}")
    if not present:
        if "ipu" in data:
            raise reader.fail(f"[ipu] belongs to a family definition: add [{'], ['.join(SECTIONS)}]")
        return None
    missing = [name for name in SECTIONS if name not in data]
    if missing:
        raise reader.fail(f"the family definition needs [{'], ['.join(SECTIONS)}]; [{missing[0]}] is missing")
    family = reader.string(data.get("family"), "family")
    package = reader.string(data.get("package"), "package")
    recipe_classes = data.get("classes")
    if not isinstance(recipe_classes, list) or not all(isinstance(c, str) for c in recipe_classes):
        raise reader.fail(f"classes must be a list of class names, got {recipe_classes!r}")

    model = reader.table(data["model"], "model", ("config", "default_class", "classes"),
                         ("config", "default_class", "classes"))
    config_class = reader.string(model["config"], "model.config", _IDENTIFIER, "a class name")
    described = reader.table(model["classes"], "model.classes", recipe_classes)
    classes = {}
    for name in recipe_classes:
        if name not in described:
            raise reader.fail(f"model.classes.{name} is missing (every class the recipe generates is described)")
        where = f"model.classes.{name}"
        entry = reader.table(described[name], where, ("output", "base"), ("output",))
        base = entry.get("base", "")
        classes[name] = ClassInfo(name, reader.string(entry["output"], f"{where}.output", _IDENTIFIER, "a name"),
                                  reader.path(base, f"{where}.base") if base else "")
    default_class = reader.string(model["default_class"], "model.default_class")
    if default_class not in classes:
        raise reader.fail(f"model.default_class {default_class!r} is not one of the recipe's classes")

    pipeline = reader.table(data["pipeline"], "pipeline", ("lengths", "inputs", "blocks"),
                            ("lengths", "inputs", "blocks"))
    lengths = {}
    for name, value in reader.table(pipeline["lengths"], "pipeline.lengths", pipeline["lengths"]).items():
        reader.string(name, "pipeline.lengths", _LENGTH, "lowercase letters and digits")
        if name in _RESERVED_LENGTHS:
            raise reader.fail(f"pipeline.lengths: {name!r} is reserved (batch size / partition-model's --seq-len)")
        lengths[name] = reader.positive(value, f"pipeline.lengths.{name}")
    if not lengths:
        raise reader.fail("pipeline.lengths names no sequence length")
    inputs_table = reader.table(pipeline["inputs"], "pipeline.inputs", pipeline["inputs"])
    if not inputs_table:
        raise reader.fail("pipeline.inputs names no input")
    inputs = tuple(reader.input(reader.string(name, "pipeline.inputs", _IDENTIFIER, "an argument name"), value,
                                f"pipeline.inputs.{name}", lengths) for name, value in inputs_table.items())
    chain = _chain(reader, pipeline["blocks"])

    shapes_table = reader.table(data["shapes"], "shapes", ("default", "verify", "common", "named"),
                                ("default", "named"))
    common = _config_values(reader, shapes_table.get("common", {}), "shapes.common")
    named = reader.table(shapes_table["named"], "shapes.named", shapes_table["named"])
    shapes = {name: {**common, **_config_values(reader, values, f"shapes.named.{name}")}
              for name, values in named.items()}
    default_shape = reader.string(shapes_table["default"], "shapes.default")
    verify_shape = reader.string(shapes_table.get("verify", default_shape), "shapes.verify")
    for key, shape in (("default", default_shape), ("verify", verify_shape)):
        if shape not in shapes:
            raise reader.fail(f"shapes.{key} {shape!r} is not one of shapes.named ({', '.join(shapes)})")

    return FamilyDefinition(family, package, config_class, default_class, classes, lengths, inputs, chain, shapes,
                            default_shape, _shared_weights(reader, data.get("transforms", []), classes),
                            _ipu(reader, data.get("ipu", {}), shapes), verify_shape)


def _ipu(reader: _Reader, section: Any, shapes: Mapping[str, Any]) -> IPUSection:
    section = reader.table(section, "ipu", (*IPU_DEFAULTS, "published"))
    defaults: dict[str, Any] = {}
    for key, kind in IPU_DEFAULTS.items():
        if key not in section:
            continue
        value, where = section[key], f"ipu.{key}"
        if kind == "boolean":
            defaults[key] = reader.boolean(value, where)
        elif kind == "positive":
            defaults[key] = reader.positive(value, where)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise reader.fail(f"{where} must be a number in (0, 1], got {value!r}")
        else:
            defaults[key] = float(value)
    published = {}
    layouts = reader.table(section.get("published", {}), "ipu.published", shapes)
    for shape, layout in layouts.items():
        where = f"ipu.published.{shape}"
        layout = reader.table(layout, where, ("ipus", "layers_per_ipu", "source"), ("ipus", "layers_per_ipu", "source"))
        ipus = reader.positive(layout["ipus"], f"{where}.ipus")
        counts = layout["layers_per_ipu"]
        if not (isinstance(counts, list) and len(counts) == ipus
                and all(not isinstance(n, bool) and isinstance(n, int) and n >= -1 for n in counts)):
            raise reader.fail(f"{where}.layers_per_ipu must list {ipus} layer counts (>= 0, or -1), got {counts!r}")
        published[shape] = PublishedLayout(shape, ipus, tuple(counts), reader.string(layout["source"], f"{where}.source"))
    return IPUSection(defaults, published)


def _chain(reader: _Reader, blocks: Any) -> tuple[ChainEntry, ...]:
    if not isinstance(blocks, list) or not blocks:
        raise reader.fail("pipeline.blocks must be a non-empty array of tables ([[pipeline.blocks]])")
    chain, names = [], set()
    for index, block in enumerate(blocks):
        where = f"pipeline.blocks[{index}]"
        reader.table(block, where, ("name", "modules", "layers", "sublayers", "root"))
        root = reader.boolean(block.get("root", False), f"{where}.root")
        if "layers" in block:
            for key in ("name", "modules"):
                if key in block:
                    raise reader.fail(f"{where}.{key}: a layer list names its blocks by item (give name and "
                                      f"modules, or layers)")
            sublayers = block.get("sublayers", [])
            if not isinstance(sublayers, list):
                raise reader.fail(f"{where}.sublayers must be a list of module lists, got {sublayers!r}")
            entry = ChainEntry(layers=reader.path(block["layers"], f"{where}.layers"), root=root,
                               sublayers=tuple(reader.paths(s, f"{where}.sublayers[{i}]")
                                               for i, s in enumerate(sublayers)))
        else:
            if "sublayers" in block:
                raise reader.fail(f"{where}.sublayers is only for a layer list (layers = ...)")
            for key in ("name", "modules"):
                if key not in block:
                    raise reader.fail(f"{where}.{key} is missing (a fixed block has a name and modules; a layer "
                                      f"list has layers)")
            entry = ChainEntry(name=reader.string(block["name"], f"{where}.name", _PATH, "a block name"),
                               modules=reader.paths(block["modules"], f"{where}.modules"), root=root)
        name = entry.layers or entry.name
        if name in names:
            raise reader.fail(f"{where}: {name!r} appears twice in the chain")
        names.add(name)
        chain.append(entry)
    return tuple(chain)


def _config_values(reader: _Reader, values: Any, where: str) -> dict[str, Any]:
    values = reader.table(values, where, values if isinstance(values, dict) else ())
    for key, value in values.items():
        reader.string(key, where, _IDENTIFIER, "config attribute names")
        scalar = (str, int, float, bool)
        if not (isinstance(value, scalar) or isinstance(value, list) and all(isinstance(v, scalar) for v in value)):
            raise reader.fail(f"{where}.{key} must be a config value (string, number, boolean or a list of them)")
    return dict(values)


def _shared_weights(reader: _Reader, steps: Any,
                    classes: Mapping[str, ClassInfo]) -> dict[str, tuple[SharedWeight, ...]]:
    """Per class, the weights the recipe's ``shared_weight`` steps plumb: their users, tied linear and its flag.

    A step's ``models`` are the classes owning the weight (each with its ``shared`` module, ``users``
    and tied linear); its ``forwards`` only say how the weight travels inside them.
    """
    found: dict[str, list[SharedWeight]] = {name: [] for name in classes}
    for index, step in enumerate(steps if isinstance(steps, list) else []):
        if not isinstance(step, dict) or step.get("name") != "shared_weight":
            continue
        where = f"transforms[{index}] (shared_weight)"
        models = step.get("models")
        if not isinstance(models, dict):
            raise reader.fail(f"{where}: models must be a table of classes")
        weight = reader.string(step.get("weight"), f"{where}: weight", _IDENTIFIER, "a parameter name")
        for class_name, options in models.items():
            if class_name not in classes:
                raise reader.fail(f"{where}: models.{class_name} is not one of the recipe's classes")
            if not isinstance(options, dict):
                raise reader.fail(f"{where}: models.{class_name} must be a table")
            module = reader.path(options.get("shared"), f"{where}: models.{class_name}.shared")
            users = reader.paths(options.get("users"), f"{where}: models.{class_name}.users")
            tied_linear = options.get("tied_linear")
            tied_config = None
            if tied_linear is not None:
                reader.path(tied_linear, f"{where}: models.{class_name}.tied_linear")
                if "tied_when" in options:
                    flag = _CONFIG_FLAG.match(str(options["tied_when"]))
                    if flag is None:
                        raise reader.fail(f"{where}: models.{class_name}.tied_when must read one config flag "
                                          f"(self.config.NAME), got {options['tied_when']!r}")
                    tied_config = flag.group(1)
            found[class_name].append(SharedWeight(weight, module, users, tied_linear, tied_config))
    return {name: tuple(weights) for name, weights in found.items()}
