"""Per-family recipes: data files under ``converter/recipe_data/*.toml``.

A recipe names the source file inside the distribution, the classes the
generated module must provide, the releases known to convert correctly and the
ordered transforms (with their options) that turn the source into traceable
code.  Adding a model family means adding a TOML file, not code.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from converter.errors import ConvertError


@dataclass(frozen=True)
class TransformStep:
    name: str
    options: dict[str, Any] = field(default_factory=dict)


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

    @property
    def module_name(self) -> str:
        """Dotted name the source file has inside its distribution."""
        return self.source.removesuffix(".py").replace("/", ".")

    @property
    def members(self) -> tuple[str, ...]:
        return (self.source, *self.support)


def _parse(data: dict[str, Any], origin: str) -> Recipe:
    try:
        steps = tuple(
            TransformStep(step["name"], {k: v for k, v in step.items() if k != "name"})
            for step in data.get("transforms", [])
        )
        recipe = Recipe(
            family=data["family"],
            package=data["package"],
            source=data["source"],
            classes=tuple(data["classes"]),
            known_versions={v: meta["sha256"] for v, meta in data.get("versions", {}).items()},
            transforms=steps,
            support=tuple(data.get("support", ())),
            pins={v: {data["source"]: meta["sha256"], **meta.get("support_sha256", {})}
                  for v, meta in data.get("versions", {}).items()},
        )
    except (KeyError, TypeError) as exc:
        raise ConvertError(f"recipe {origin} is malformed: missing or bad field {exc}") from None
    for version, meta in data.get("versions", {}).items():
        pinned = set(meta.get("support_sha256", {}))
        if pinned != set(recipe.support):
            raise ConvertError(f"recipe {origin}: versions.{version}.support_sha256 must pin exactly the support "
                               f"files {sorted(recipe.support)}, not {sorted(pinned)}")
    return recipe


def load_recipes() -> dict[str, Recipe]:
    recipes = {}
    for entry in sorted((resources.files("converter") / "recipe_data").iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".toml"):
            recipe = _parse(tomllib.loads(entry.read_text(encoding="utf-8")), entry.name)
            recipes[recipe.family] = recipe
    return recipes


def get_recipe(family: str) -> Recipe:
    recipes = load_recipes()
    if family not in recipes:
        known = ", ".join(sorted(recipes)) or "none"
        raise ConvertError(f"unknown model family {family!r}; known families: {known}")
    return recipes[family]
