"""Recipe loading: typed options checked at load, release ranges, overrides, optional steps."""

from __future__ import annotations

import logging
from pathlib import Path

import libcst as cst
import pytest
import tomllib
from conftest import FIXTURES, REPO

from common.errors import UserError
from converter.fetch import Fetcher
from converter.pipeline import transform_module
from converter.recipes import Recipe, get_recipe, parse_recipe
from transforms import REGISTRY
from transforms.shared_weight import SharedWeightOptions

T5_TOML = (REPO / "families/recipe_data/t5.toml").read_text()
STEP_NAMES = [step["name"] for step in tomllib.loads(T5_TOML)["transforms"]]
HEAD = """\
family = "toy"
package = "transformers"
source = "toy/modeling_toy.py"
classes = ["Toy"]
"""


def load(text: str) -> Recipe:
    return parse_recipe(text, "toy.toml")


def error_of(text: str) -> str:
    with pytest.raises(UserError) as caught:
        load(text)
    message = caught.value.one_line()
    assert "\n" not in message
    return message


def test_the_t5_recipe_loads_with_typed_options() -> None:
    recipe = get_recipe("t5")
    step = next(s for s in recipe.transforms if s.name == "shared_weight")
    options = step.options_for("4.5.1")
    assert isinstance(options, SharedWeightOptions)
    assert options.models["T5EncoderModel"].users == ("encoder.embed_tokens",)
    assert options.models["T5ForConditionalGeneration"].tied_linear == "lm_head"
    assert options.forwards["T5Model"].calls == {"self.encoder": "T5Stack", "self.decoder": "T5Stack"}
    assert options.forwards["T5Stack"].uses == ("self.embed_tokens",)


def test_misspelled_top_level_key() -> None:
    assert error_of(HEAD + 'clases = ["Toy"]\n') == (
        "recipe toy.toml: clases: unknown key (did you mean classes?); "
        "known: family, package, source, classes, support, support_versions, versions, transforms, model, pipeline, "
            "shapes, ipu")


def test_misspelled_option_key() -> None:
    text = T5_TOML.replace('pure_methods = ["get_head_mask", "to"]', 'pure_method = ["get_head_mask", "to"]')
    assert error_of(text).startswith(
        "recipe toy.toml: transform specialize_arguments: pure_method: unknown key (did you mean pure_methods?)")


def test_misspelled_nested_option_key() -> None:
    text = T5_TOML.replace('tied_linear = "lm_head"', 'tied_linaer = "lm_head"')
    assert error_of(text).startswith("recipe toy.toml: transform shared_weight: "
                                     "models.T5ForConditionalGeneration.tied_linaer: unknown key "
                                     "(did you mean tied_linear?)")


def test_misspelled_key_in_a_list_of_tables() -> None:
    text = T5_TOML.replace('reason = "attention_mask must be (batch, seq_len)"',
                           'raison = "attention_mask must be (batch, seq_len)"')
    facts = [fact["reason"] for step in tomllib.loads(T5_TOML)["transforms"] for fact in step.get("facts", ())]
    index = facts.index("attention_mask must be (batch, seq_len)")
    assert error_of(text).startswith(f"recipe toy.toml: transform specialize_arguments: facts[{index}].raison: "
                                     "unknown key")


@pytest.mark.parametrize(("old", "new", "expected"), [
    ('methods = ["get_extended_attention_mask", "invert_attention_mask"]', 'methods = "invert_attention_mask"',
     "transform override_inherited: methods: expected a list, not str 'invert_attention_mask'"),
    ('weight = "shared_embed_weight"', "weight = 3", "transform shared_weight: weight: expected a string, not int 3"),
    ('use_cache = "False"', "use_cache = false", "constants.use_cache: expected a string, not bool False"),
    ('output_attentions = "False"', 'output_attentions = "f(x)"', "'f(x)' is not a literal constant"),
    ('name = "hoist_modules"', 'name = "hoist_module"',
     f"transforms[{STEP_NAMES.index('hoist_modules')}]: name: unknown transform 'hoist_module'"),
    ('parameter = "shared_embedding"\n', "", "transform shared_weight: parameter: missing (required)"),
    ('calls = { "self.encoder" = "T5Stack" }', 'calls = { "self.encoder" = "T5Stak" }',
     "transform shared_weight: forwards.T5EncoderModel.calls: self.encoder runs T5Stak, which has no forwards entry"),
    ('uses = ["self.embed_tokens"]', 'uses = []', "transform shared_weight: forwards.T5Stack: neither calls nor uses"),
])
def test_wrong_types_and_values(old: str, new: str, expected: str) -> None:
    assert old in T5_TOML
    assert expected in error_of(T5_TOML.replace(old, new))


def test_every_transform_declares_options_that_do_not_clash_with_step_keys() -> None:
    import dataclasses
    for name, transform in REGISTRY.items():
        fields = {f.name for f in dataclasses.fields(transform.Options)}
        assert not fields & {"name", "versions", "optional", "overrides"}, name


RANGED = HEAD + """
[[transforms]]
name = "size_varargs"
versions = ">=4.20,<4.46"

[[transforms]]
name = "none_checks"
optional = true
module = "helpers"
[[transforms.overrides]]
versions = ">=5"
module = "helpers.v5"
[[transforms.overrides]]
versions = "==5.1.*"
module = "helpers.v51"
"""


def test_steps_apply_to_their_release_range_with_overrides() -> None:
    recipe = load(RANGED)
    assert [s.name for s in recipe.steps_for("4.5.1")] == ["none_checks"]
    assert [s.name for s in recipe.steps_for("4.20.1")] == ["size_varargs", "none_checks"]
    assert [s.name for s in recipe.steps_for("4.46.0")] == ["none_checks"]
    assert [s.name for s in recipe.steps_for(None)] == ["none_checks"]
    none_checks = recipe.steps_for("4.5.1")[0]
    assert none_checks.optional
    assert none_checks.options_for("4.57.1").module == "helpers"
    assert none_checks.options_for("5.0.0").module == "helpers.v5"
    assert none_checks.options_for("5.1.2").module == "helpers.v51"


RANGED_FACTS = HEAD + """
[[transforms]]
name = "specialize_arguments"
constants = { use_cache = "False" }
[[transforms.facts]]
expression = "self.a"
value = "1"
[[transforms.facts]]
expression = "self.b > 1"
value = "False"
versions = "<4.41"
"""


def test_a_fact_saying_versions_applies_only_to_them() -> None:
    step = load(RANGED_FACTS).steps_for("4.40.2")[0]
    assert [f.expression for f in step.options_for("4.40.2").facts] == ["self.a", "self.b > 1"]
    assert [f.expression for f in step.options_for("4.46.3").facts] == ["self.a"]
    assert [f.expression for f in step.options_for(None).facts] == ["self.a"]
    assert "facts[1].versions: '4.41+' is not a release range" in error_of(RANGED_FACTS.replace('"<4.41"', '"4.41+"'))
    assert "facts[1].versin: unknown key" in error_of(RANGED_FACTS.replace('versions = "<4.41"', 'versin = "<4.41"'))


@pytest.mark.parametrize(("text", "expected"), [
    (RANGED.replace('">=4.20,<4.46"', '"4.20+"'), "transform size_varargs: versions: '4.20+' is not a release range"),
    (RANGED.replace('module = "helpers.v5"', 'modul = "helpers.v5"'),
     "transform none_checks: overrides[0].modul: unknown key (did you mean module?)"),
    (RANGED.replace('module = "helpers.v5"', "module = 5"),
     "transform none_checks: overrides[0].module: expected a string, not int 5"),
    (RANGED.replace("optional = true", 'optional = "yes"'), "transform none_checks: optional: expected true or false"),
])
def test_bad_ranges_and_overrides(text: str, expected: str) -> None:
    assert expected in error_of(text)


def _convert_toy(recipe_text: str, source: str, version: str | None, caplog: pytest.LogCaptureFixture) -> str:
    recipe = load(recipe_text)
    with caplog.at_level(logging.WARNING, logger="converter"):
        return transform_module(cst.parse_module(source), recipe, {}, version).code


def test_a_transform_that_finds_nothing_warns_unless_optional(caplog: pytest.LogCaptureFixture) -> None:
    text = HEAD + '\n[[transforms]]\nname = "size_varargs"\n\n[[transforms]]\nname = "none_checks"\noptional = true\n'
    assert _convert_toy(text, "x = 1\n", "4.5.1", caplog) == "x = 1\n"
    assert [r.getMessage() for r in caplog.records] == [
        "transform size_varargs found nothing to rewrite (mark the step optional = true in the recipe if that "
        "is expected)"]


def test_the_t5_recipe_finds_something_for_every_step(caplog: pytest.LogCaptureFixture) -> None:
    recipe = get_recipe("t5")
    supports = Fetcher(recipe.package, "4.5.1", FIXTURES / "cache", "cache").fetch(recipe.members)
    with caplog.at_level(logging.WARNING, logger="converter"):
        transform_module(cst.parse_module(supports[recipe.source].text), recipe,
                         {m: supports[m] for m in recipe.support}, "4.5.1")
    assert caplog.records == []


def test_a_transform_error_is_one_line_naming_the_transform_not_a_recipe_error(tmp_path: Path) -> None:
    text = HEAD + '\n[[transforms]]\nname = "single_output"\n[transforms.returns]\nToy = "labels"\n'
    recipe = load(text)
    with pytest.raises(UserError) as caught:
        transform_module(cst.parse_module("class Toy:\n    def forward(self):\n        return 1\n"), recipe, {}, "4.5.1")
    assert caught.value.one_line() == ("transform single_output does not apply to transformers 4.5.1: "
                                       "Toy.forward does not bind labels used by its recipe return value")


def test_a_bug_in_a_transform_is_not_reported_as_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    from transforms.size_varargs import SizeVarargs

    def broken(self: object, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        raise ValueError("index out of range")

    monkeypatch.setattr(SizeVarargs, "leave_Call", broken)
    recipe = load(HEAD + '\n[[transforms]]\nname = "size_varargs"\n')
    with pytest.raises(ValueError, match="index out of range") as caught:
        transform_module(cst.parse_module("import torch\nx = torch.ones(a, b)\n"), recipe, {}, "4.5.1")
    assert not isinstance(caught.value, UserError)
    assert any("raised by transform size_varargs" in note for note in caught.value.__notes__)


# -- no silent success: what render() refuses to return ----------------------------------------------------

def _render_toy(recipe_text: str, source: str, version: str = "4.5.1") -> dict:
    from converter.fetch import SourceFile
    from converter.pipeline import Conversion, render

    recipe = load(recipe_text)
    sources = {recipe.source: SourceFile(recipe.source, source, "0" * 64, "file:toy")}
    return render(Conversion(recipe, version, sources, "convert-model toy"), "modeling_toy.py")


def test_generated_code_that_does_not_compile_names_the_transform(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transform writing ``0.clone()`` (what 5.x once got) is caught before anything is returned."""
    from transforms.size_varargs import SizeVarargs

    def broken(self: object, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        return cst.parse_expression("0 .clone()").with_changes(
            func=cst.Attribute(value=cst.Integer("0"), attr=cst.Name("clone")))

    monkeypatch.setattr(SizeVarargs, "leave_Call", broken)
    text = HEAD + '\n[[transforms]]\nname = "none_checks"\noptional = true\n\n[[transforms]]\nname = "size_varargs"\n'
    with pytest.raises(UserError) as caught:
        _render_toy(text, "import torch\n\nclass Toy:\n    pass\n\nx = torch.ones(a, b)\n")
    message = caught.value.one_line()
    assert message.startswith("generated modeling_toy.py for transformers 4.5.1: modeling_toy.py:6 does not compile")
    assert message.endswith("(produced by transform size_varargs)")


def test_a_call_that_does_not_fit_its_callee_is_refused_with_its_origin() -> None:
    """The signature check runs on every generated file; a fault already in the source is named as such."""
    text = HEAD + '\n[[transforms]]\nname = "none_checks"\noptional = true\n'
    source = ("class Toy:\n"
              "    def helper(self, x):\n"
              "        return x\n\n"
              "    def forward(self, x, mask):\n"
              "        return self.helper(x, mask)\n")
    with pytest.raises(UserError) as caught:
        _render_toy(text, source)
    assert caught.value.one_line() == (
        "generated modeling_toy.py for transformers 4.5.1: modeling_toy.py:6: the call of Toy.helper (defined at "
        "line 2) does not fit its signature: it takes 1 positional arguments but 2 were given: "
        "`return self.helper(x, mask)` (produced by the source itself)")
