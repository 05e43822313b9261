"""The registry of recipes: one TOML file per family under ``families/recipe_data/``.

The converter reads a recipe's transform steps from it; every later stage reads
its family definition (:mod:`families.definition`).  Both read the same files
through :func:`recipe_documents` and :func:`resolve`.

A recipe may extend a base (``extends = "llm"``: ``recipe_data/llm.toml``, a file
saying ``base = true``, which is no family of its own).  What families share lives
once in the base; :func:`extend` lays the recipe over it:

* tables merge key by key, recursively;
* ``transforms`` merge step by step: a step of the recipe naming a step of the base
  (``name``) is laid over it, in the base's place; ``drop = true`` removes that step;
  a step of a new name goes after the step its ``after`` names, or at the end;
* any other array of tables (``overrides``, ``facts``, ``pipeline.blocks``) is the
  base's items followed by the recipe's;
* any other value of the recipe replaces the base's.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import tomllib

from common.errors import UserError
from families.definition import FamilyDefinition, parse_definition


def parse_document(text: str, origin: str) -> dict[str, Any]:
    """The data of one recipe's TOML ``text``; ``origin`` names the file in errors."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"recipe {origin} is not valid TOML: {error}") from None


_BASE_KEYS = ("base", "extends")


def _is_tables(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        old = merged.get(key)
        if key == "transforms" and isinstance(old, list) and isinstance(value, list):
            merged[key] = _merge_steps(old, value)
        elif isinstance(old, dict) and isinstance(value, dict):
            merged[key] = _merge(old, value)
        elif isinstance(old, list) and isinstance(value, list) and _is_tables(old) and _is_tables(value):
            merged[key] = [*old, *value]
        else:
            merged[key] = value
    return merged


def _merge_steps(base: list[Any], over: list[Any]) -> list[Any]:
    steps = [dict(step) for step in base]
    for position, step in enumerate(over):
        if not isinstance(step, dict) or not isinstance(step.get("name"), str):
            raise UserError(f"transforms[{position}]: a step of an extending recipe needs a name")
        named = [index for index, old in enumerate(steps) if old.get("name") == step["name"]]
        if len(named) > 1:
            raise UserError(f"transforms[{position}]: the base has {len(named)} {step['name']} steps; "
                            "an extending recipe can only lay a step over a base step of a unique name")
        own = {key: value for key, value in step.items() if key not in ("after", "drop")}
        if named and step.get("drop") is True:
            del steps[named[0]]
        elif named:
            steps[named[0]] = _merge(steps[named[0]], own)
        elif "after" in step:
            anchor = [index for index, old in enumerate(steps) if old.get("name") == step["after"]]
            if not anchor:
                raise UserError(f"transforms[{position}]: after = {step['after']!r} names no step")
            steps.insert(anchor[-1] + 1, own)
        else:
            steps.append(own)
    return steps


def extend(base: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """The recipe ``data`` laid over the base recipe ``base`` (the module's rules), without the base's own keys."""
    return _merge({k: v for k, v in base.items() if k not in _BASE_KEYS},
                  {k: v for k, v in data.items() if k != "extends"})


def resolve(data: dict[str, Any], origin: str, documents: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """``data`` with the base it ``extends`` (read from ``documents``, default the registry's) laid under it."""
    name = data.get("extends")
    if name is None:
        return data
    found = dict(documents if documents is not None else recipe_documents()).get(f"{name}.toml") \
        if isinstance(name, str) else None
    if found is None:
        raise UserError(f"recipe {origin}: extends = {name!r} names no recipe_data/<name>.toml")
    base = parse_document(found, f"{name}.toml")
    if base.get("base") is not True:
        raise UserError(f"recipe {origin}: extends {name}.toml, which is not a base (base = true)")
    try:
        return extend(base, data)
    except UserError as error:
        raise UserError(f"recipe {origin}: {error}") from None


def family_documents() -> list[tuple[str, dict[str, Any]]]:
    """``(file name, data)`` of every family recipe, bases laid under those that extend one; bases skipped."""
    documents = recipe_documents()
    found = []
    for origin, text in documents:
        data = parse_document(text, origin)
        if data.get("base") is not True:
            found.append((origin, resolve(data, origin, documents)))
    return found


def recipe_documents() -> list[tuple[str, str]]:
    """``(file name, text)`` of every recipe, by file name."""
    entries = sorted((resources.files("families") / "recipe_data").iterdir(), key=lambda p: p.name)
    return [(entry.name, entry.read_text(encoding="utf-8")) for entry in entries if entry.name.endswith(".toml")]


def definitions() -> dict[str, FamilyDefinition]:
    """Every family whose recipe has a family definition."""
    found = {}
    for origin, data in family_documents():
        definition = parse_definition(data, origin)
        if definition is not None:
            found[definition.family] = definition
    return found


def definition(name: str) -> FamilyDefinition:
    known = definitions()
    if name not in known:
        raise UserError(f"unknown family {name!r}; known: {', '.join(sorted(known)) or 'none'}")
    return known[name]
