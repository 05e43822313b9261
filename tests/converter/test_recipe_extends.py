"""``extends = "llm"``: a recipe laid over a base recipe (families/registry.py)."""

from __future__ import annotations

import pytest

from common.errors import UserError
from converter.recipes import load_recipes
from families.registry import extend, resolve

BASE = {"base": True, "package": "transformers",
        "transforms": [{"name": "absolute_imports"},
                       {"name": "single_output", "overrides": [{"versions": "<5", "method": "forward"}]},
                       {"name": "none_checks"}]}


def test_steps_merge_by_name_in_the_base_s_place_and_tables_merge() -> None:
    data = {"extends": "llm", "family": "toy", "transforms": [
        {"name": "single_output", "returns": {"Toy": "x"}, "overrides": [{"versions": ">=5", "method": "f"}]},
        {"name": "hoist_modules", "after": "absolute_imports"},
        {"name": "none_checks", "drop": True}]}
    merged = extend(BASE, data)
    assert "base" not in merged and "extends" not in merged and merged["package"] == "transformers"
    assert [step["name"] for step in merged["transforms"]] == ["absolute_imports", "hoist_modules", "single_output"]
    single = merged["transforms"][2]
    assert single["returns"] == {"Toy": "x"}
    assert [o["versions"] for o in single["overrides"]] == ["<5", ">=5"]  # arrays of tables: base's, then its own


def test_an_unknown_base_or_a_family_as_base_is_one_line() -> None:
    with pytest.raises(UserError, match="names no recipe_data/<name>.toml"):
        resolve({"extends": "nothing"}, "toy.toml", [])
    with pytest.raises(UserError, match="not a base"):
        resolve({"extends": "t5"}, "toy.toml", [("t5.toml", 'family = "t5"')])


def test_the_llm_families_extend_the_base_and_the_base_is_no_family() -> None:
    recipes = load_recipes()
    assert "llm" not in {recipe.family for recipe in recipes.values()}
    for family in ("llama", "qwen2", "qwen3", "mistral"):
        steps = [step.name for step in recipes[family].transforms]
        assert steps[0] == "absolute_imports" and steps[-1] == "none_checks" and "shared_weight" in steps
        assert recipes[family].package == "transformers"
