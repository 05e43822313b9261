"""Realistic cases: excerpts of a family's real source through its whole recipe, against reviewed output.

A case ``<family>_<name>.in.py`` runs through ``families/recipe_data/<family>.toml``.

Set UPDATE_GOLDEN=1 to rewrite the .out.py files after an intended change, then review the diff.
"""

from __future__ import annotations

import os

import libcst as cst
import pytest
from conftest import FIXTURES

from converter.fetch import Fetcher
from converter.pipeline import transform_module
from converter.recipes import get_recipe

GOLDEN = FIXTURES / "golden"
CASES = sorted(p.name.removesuffix(".in.py") for p in GOLDEN.glob("*.in.py"))


def convert(text: str, family: str = "t5") -> str:
    recipe = get_recipe(family)
    supports = Fetcher(recipe.package, "4.5.1", FIXTURES / "cache", "cache").fetch(recipe.support_for("4.5.1"))
    return transform_module(cst.parse_module(text), recipe, supports, "4.5.1").code


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    family = case.partition("_")[0]
    source = (GOLDEN / f"{case}.in.py").read_text()
    expected_path = GOLDEN / f"{case}.out.py"
    actual = convert(source, family)
    if os.environ.get("UPDATE_GOLDEN"):
        expected_path.write_text(actual)
    assert actual == expected_path.read_text()
    assert convert(actual, family) == actual, "the recipe is not idempotent on this case"
    compile(actual, str(expected_path), "exec")


def test_there_are_golden_cases() -> None:
    assert len(CASES) >= 2


@pytest.mark.parametrize("family,path", [("t5", "t5/v4_5_1/modeling_t5.py"), ("gpt2", "gpt2/v4_5_1/modeling_gpt2.py"),
                                         ("bart", "bart/v4_5_1/modeling_bart.py")])
def test_pipeline_leaves_its_own_full_output_unchanged(family: str, path: str) -> None:
    from conftest import REPO
    generated = (REPO / "generated_models" / path).read_text()
    header, _, body = generated.partition("\n\n")
    assert header.startswith("# @generated")
    assert convert(body, family) == body


def test_import_edits_on_the_leading_block_equal_a_full_pass() -> None:
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import AddImportsVisitor

    from converter.pipeline import add_imports
    source = (FIXTURES / "cache/transformers-4.5.1/transformers/models/t5/modeling_t5.py").read_text()
    # A later top-level import (T5 from 4.35 has one) of a name to add and of a module to extend: left alone.
    later = source + "\nfrom typing import Tuple\nfrom torch import Size\n"
    for tree in (cst.parse_module(source), cst.parse_module(later)):
        results = []
        for edit in (add_imports, lambda t, c: AddImportsVisitor(c).transform_module(t)):
            context = CodemodContext()
            AddImportsVisitor.add_needed_import(context, "stateless")
            AddImportsVisitor.add_needed_import(context, "stateless", "is_None")
            AddImportsVisitor.add_needed_import(context, "torch", "Tensor")
            AddImportsVisitor.add_needed_import(context, "typing", "Tuple")
            results.append(edit(tree, context).code)
        assert results[0] == results[1]
        assert "from typing import Tuple" in results[0] and "import stateless" in results[0]
