"""Per-family recipes: data files under ``families/recipe_data/*.toml``.

A recipe names the source file inside the distribution, the classes the
generated module must provide, the releases known to convert correctly and the
ordered transforms (with their options) that turn the source into traceable
code.  Adding a model family means adding a TOML file, not code.

Everything is checked when the recipe loads: the top-level keys against
:class:`RecipeFile`, each ``[[transforms]]`` step's keys against its
transform's ``Options`` dataclass (``transforms/<name>.py``).  A step may also
say which releases it applies to and override options for release ranges::

    [[transforms]]
    name = "override_inherited"
    versions = ">=4.5,<5"            # skipped for other releases
    optional = true                  # finding nothing to rewrite is expected, not a warning
    methods = ["get_extended_attention_mask"]
    [[transforms.overrides]]         # later matching overrides win
    versions = ">=4.17"
    methods = ["get_extended_attention_mask", "create_extended_attention_mask_for_decoder"]

A recipe saying ``extends = "llm"`` is read laid over the base ``llm.toml``
(``families.registry.extend``: tables merge, steps merge by name); a base
(``base = true``) is no family and is only read that way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from common.errors import UserError
from common.schema import OptionError, parse_options
from common.versions import Release, VersionError, VersionRange
from families.definition import FamilyDefinition, parse_definition
from families.registry import family_documents, parse_document, resolve
from transforms import REGISTRY


@dataclass(frozen=True)
class VersionPin:
    sha256: str  # of the recipe's source file in that release
    support_sha256: dict[str, str] = field(default_factory=dict)  # of each support file that release reads


@dataclass(frozen=True)
class RecipeFile:
    """The top-level keys of a recipe file; a new section is one more field here."""

    family: str
    package: str
    source: str
    classes: tuple[str, ...]
    support: tuple[str, ...] = ()
    # Support files only some releases read (member -> release range); the others are read by every release.
    support_versions: dict[str, str] = field(default_factory=dict)
    versions: dict[str, VersionPin] = field(default_factory=dict)  # releases verified to convert
    transforms: tuple[dict[str, Any], ...] = ()  # steps, checked by _step against their transform
    # The family definition's sections, checked by families.definition.parse_definition.
    model: dict[str, Any] = field(default_factory=dict)
    pipeline: dict[str, Any] = field(default_factory=dict)
    shapes: dict[str, Any] = field(default_factory=dict)
    ipu: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Override:
    versions: VersionRange
    values: dict[str, Any]  # option keys replaced for releases in range


@dataclass(frozen=True)
class TransformStep:
    name: str
    options: dict[str, Any] = field(default_factory=dict)  # as the recipe gives them, checked at load
    versions: VersionRange | None = None  # None: every release
    optional: bool = False  # finding nothing to rewrite is no warning
    overrides: tuple[Override, ...] = ()

    def applies_to(self, version: str | None) -> bool:
        """Whether the step runs for ``version`` (None: an unknown release, where only unranged steps run)."""
        if self.versions is None:
            return True
        return version is not None and version in self.versions

    def options_for(self, version: str | None) -> Any:
        """The typed options for ``version``: the step's, with each matching override applied in order."""
        values = dict(self.options)
        for override in self.overrides:
            if version is not None and version in override.versions:
                values.update(override.values)
        return parse_options(REGISTRY[self.name].Options, _ranged_items(values, version))


def _ranged_items(values: dict[str, Any], version: str | None, every: bool = False) -> dict[str, Any]:
    """``values`` with each table of a list option that says ``versions`` kept only for those releases.

    One fact of many can then be limited to the releases whose code it describes (the same expression
    may mean something else in another release) without an override repeating the whole list.
    ``every``: keep them all (checking the ranges), as the recipe's load-time check does.
    """
    selected = {}
    for key, value in values.items():
        if isinstance(value, list) and any(isinstance(item, dict) and "versions" in item for item in value):
            kept = []
            for index, item in enumerate(value):
                if isinstance(item, dict) and "versions" in item:
                    try:
                        ranged = _range(item["versions"])
                    except OptionError as error:
                        raise error.under(f"{key}[{index}]") from None
                    if not every and (version is None or version not in ranged):
                        continue
                    item = {k: v for k, v in item.items() if k != "versions"}
                kept.append(item)
            value = kept
        selected[key] = value
    return selected


@dataclass(frozen=True)
class Recipe:
    family: str
    package: str
    source: str
    classes: tuple[str, ...]
    known_versions: dict[str, str]  # version -> sha256 of the source file
    transforms: tuple[TransformStep, ...]
    support: tuple[str, ...] = ()
    # The [model]/[pipeline]/[shapes] sections every later stage reads (families/definition.py); None if absent.
    definition: FamilyDefinition | None = None
    support_versions: dict[str, VersionRange] = field(default_factory=dict)  # member -> releases reading it
    pins: dict[str, dict[str, str]] = field(default_factory=dict)  # verified release -> member -> sha256

    @property
    def module_name(self) -> str:
        """Dotted name the source file has inside its distribution."""
        return self.source.removesuffix(".py").replace("/", ".")

    @property
    def members(self) -> tuple[str, ...]:
        """Every file some release reads."""
        return (self.source, *self.support)

    def verified_versions(self) -> list[str]:
        """The verified releases, oldest first."""
        return sorted(self.known_versions, key=Release.parse)

    def support_for(self, version: str) -> tuple[str, ...]:
        """The support files release ``version`` reads."""
        return tuple(member for member in self.support
                     if member not in self.support_versions or version in self.support_versions[member])

    def members_for(self, version: str) -> tuple[str, ...]:
        return (self.source, *self.support_for(version))

    def steps_for(self, version: str | None) -> tuple[TransformStep, ...]:
        return tuple(step for step in self.transforms if step.applies_to(version))


_STEP_KEYS = ("name", "versions", "optional", "overrides")


def _range(text: object) -> VersionRange:
    if not isinstance(text, str):
        raise OptionError("versions", "expected a release range string such as \">=4.20,<4.46\"")
    try:
        return VersionRange.parse(text)
    except VersionError as error:
        raise OptionError("versions", str(error)) from None


def _step(raw: dict[str, Any]) -> TransformStep:
    name = raw.get("name")
    if name not in REGISTRY:
        raise OptionError("name", f"unknown transform {name!r}; known: {', '.join(REGISTRY)}")
    options = {key: value for key, value in raw.items() if key not in _STEP_KEYS}
    schema = REGISTRY[name].Options
    parse_options(schema, _ranged_items(options, None, every=True))
    optional = raw.get("optional", False)
    if not isinstance(optional, bool):
        raise OptionError("optional", "expected true or false")
    overrides = []
    for index, override in enumerate(raw.get("overrides", ())):
        if not isinstance(override, dict) or "versions" not in override:
            raise OptionError(f"overrides[{index}]", "expected a table with a versions range")
        values = {key: value for key, value in override.items() if key != "versions"}
        try:
            versions = _range(override["versions"])
            parse_options(schema, _ranged_items({**options, **values}, None, every=True))
        except OptionError as error:
            raise error.under(f"overrides[{index}]") from None
        overrides.append(Override(versions, values))
    applies = _range(raw["versions"]) if "versions" in raw else None
    return TransformStep(name, options, applies, optional, tuple(overrides))


def _support_ranges(recipe: RecipeFile) -> dict[str, VersionRange]:
    ranges = {}
    for member, text in recipe.support_versions.items():
        if member not in recipe.support:
            raise OptionError(f"support_versions.{member}", "is not one of the support files")
        try:
            ranges[member] = VersionRange.parse(text)
        except VersionError as error:
            raise OptionError(f"support_versions.{member}", str(error)) from None
    return ranges


def _pins(recipe: RecipeFile, ranges: dict[str, VersionRange]) -> dict[str, dict[str, str]]:
    """release -> member -> sha256; each verified release pins exactly the files it reads."""
    pins = {}
    for version, pin in recipe.versions.items():
        reads = {m for m in recipe.support if m not in ranges or version in ranges[m]}
        if set(pin.support_sha256) != reads:
            raise OptionError(f"versions.{version}.support_sha256",
                              f"must pin exactly the support files {version} reads: {', '.join(sorted(reads))}")
        pins[version] = {recipe.source: pin.sha256, **pin.support_sha256}
    return pins


def _parse(data: dict[str, Any], origin: str) -> Recipe:
    try:
        recipe = parse_options(RecipeFile, data)
        support_versions = _support_ranges(recipe)
        pins = _pins(recipe, support_versions)
    except OptionError as error:
        raise UserError(f"recipe {origin}: {error}") from None
    steps = []
    for index, raw in enumerate(recipe.transforms):
        try:
            steps.append(_step(raw))
        except OptionError as error:
            name = raw.get("name")
            where = f"transform {name}" if name in REGISTRY else f"transforms[{index}]"
            raise UserError(f"recipe {origin}: {where}: {error}") from None
    return Recipe(
        family=recipe.family,
        package=recipe.package,
        source=recipe.source,
        classes=recipe.classes,
        known_versions={version: pin.sha256 for version, pin in recipe.versions.items()},
        transforms=tuple(steps),
        support=recipe.support,
        definition=parse_definition(data, origin),
        support_versions=support_versions,
        pins=pins,
    )


def parse_recipe(text: str, origin: str) -> Recipe:
    """The recipe in TOML ``text`` (over the base it extends); ``origin`` names the file in errors."""
    data = parse_document(text, origin)
    return _parse(resolve(data, origin), origin)


def load_recipes() -> dict[str, Recipe]:
    recipes = {}
    for origin, data in family_documents():
        recipe = _parse(data, origin)
        recipes[recipe.family] = recipe
    return recipes


def get_recipe(family: str) -> Recipe:
    recipes = load_recipes()
    if family not in recipes:
        known = ", ".join(sorted(recipes)) or "none"
        raise UserError(f"unknown model family {family!r}; known families: {known}")
    return recipes[family]
