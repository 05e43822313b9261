"""The registry of recipes: one TOML file per family under ``families/recipe_data/``.

The converter reads a recipe's transform steps from it; every later stage reads
its family definition (:mod:`families.definition`).  Both read the same files
through :func:`recipe_documents`.
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


def recipe_documents() -> list[tuple[str, str]]:
    """``(file name, text)`` of every recipe, by file name."""
    entries = sorted((resources.files("families") / "recipe_data").iterdir(), key=lambda p: p.name)
    return [(entry.name, entry.read_text(encoding="utf-8")) for entry in entries if entry.name.endswith(".toml")]


def definitions() -> dict[str, FamilyDefinition]:
    """Every family whose recipe has a family definition."""
    found = {}
    for origin, text in recipe_documents():
        definition = parse_definition(parse_document(text, origin), origin)
        if definition is not None:
            found[definition.family] = definition
    return found


def definition(name: str) -> FamilyDefinition:
    known = definitions()
    if name not in known:
        raise UserError(f"unknown family {name!r}; known: {', '.join(sorted(known)) or 'none'}")
    return known[name]
