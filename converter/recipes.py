"""Per-family recipes: data files under ``converter/recipe_data/*.toml``.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import tomllib

from converter.errors import ConvertError
from converter.family import FamilyDefinition, parse_definition
from converter.versions import VersionError, VersionRange
from transforms import REGISTRY
from transforms.options import OptionError, parse_options


@dataclass(frozen=True)
class VersionPin:
    sha256: str  # of the recipe's source file in that release
    support_sha256: dict[str, str] = field(default_factory=dict)  # support file -> sha256 in that release


@dataclass(frozen=True)
class RecipeFile:
    """The top-level keys of a recipe file; a new section is one more field here."""

    family: str
    package: str
    source: str
    classes: tuple[str, ...]
    support: tuple[str, ...] = ()
    versions: dict[str, VersionPin] = field(default_factory=dict)  # releases verified to convert
    transforms: tuple[dict[str, Any], ...] = ()  # steps, checked by _step against their transform
    # The family definition's sections, checked by converter.family.parse_definition.
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
        return parse_options(REGISTRY[self.name].Options, values)


@dataclass(frozen=True)
class Recipe:
    family: str
    package: str
    source: str
    classes: tuple[str, ...]
    known_versions: dict[str, str]  # version -> sha256 of the source file
    transforms: tuple[TransformStep, ...]
    support: tuple[str, ...] = ()
    pins: dict[str, dict[str, str]] = field(default_factory=dict)  # version -> member -> sha256, every member
    # The [model]/[pipeline]/[shapes] sections every later stage reads (converter/family.py); None if absent.
    definition: FamilyDefinition | None = None

    @property
    def module_name(self) -> str:
        """Dotted name the source file has inside its distribution."""
        return self.source.removesuffix(".py").replace("/", ".")

    @property
    def members(self) -> tuple[str, ...]:
        return (self.source, *self.support)

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
    parse_options(schema, options)
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
            parse_options(schema, {**options, **values})
        except OptionError as error:
            raise error.under(f"overrides[{index}]") from None
        overrides.append(Override(versions, values))
    applies = _range(raw["versions"]) if "versions" in raw else None
    return TransformStep(name, options, applies, optional, tuple(overrides))


def _parse(data: dict[str, Any], origin: str) -> Recipe:
    try:
        recipe = parse_options(RecipeFile, data)
    except OptionError as error:
        raise ConvertError(f"recipe {origin}: {error}") from None
    steps = []
    for index, raw in enumerate(recipe.transforms):
        try:
            steps.append(_step(raw))
        except OptionError as error:
            name = raw.get("name")
            where = f"transform {name}" if name in REGISTRY else f"transforms[{index}]"
            raise ConvertError(f"recipe {origin}: {where}: {error}") from None
    for version, pin in recipe.versions.items():
        if set(pin.support_sha256) != set(recipe.support):
            raise ConvertError(f"recipe {origin}: versions.{version}.support_sha256 must pin exactly the support "
                               f"files {sorted(recipe.support)}, not {sorted(pin.support_sha256)}")
    return Recipe(
        family=recipe.family,
        package=recipe.package,
        source=recipe.source,
        classes=recipe.classes,
        known_versions={version: pin.sha256 for version, pin in recipe.versions.items()},
        transforms=tuple(steps),
        support=recipe.support,
        pins={version: {recipe.source: pin.sha256, **pin.support_sha256} for version, pin in recipe.versions.items()},
        definition=parse_definition(data, origin),
    )


def parse_recipe(text: str, origin: str) -> Recipe:
    """The recipe in TOML ``text``; ``origin`` names the file in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConvertError(f"recipe {origin} is not valid TOML: {error}") from None
    return _parse(data, origin)


def load_recipes() -> dict[str, Recipe]:
    recipes = {}
    for entry in sorted((resources.files("converter") / "recipe_data").iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".toml"):
            recipe = parse_recipe(entry.read_text(encoding="utf-8"), entry.name)
            recipes[recipe.family] = recipe
    return recipes


def get_recipe(family: str) -> Recipe:
    recipes = load_recipes()
    if family not in recipes:
        known = ", ".join(sorted(recipes)) or "none"
        raise ConvertError(f"unknown model family {family!r}; known families: {known}")
    return recipes[family]
