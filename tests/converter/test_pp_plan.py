"""The block chain and tied weights read off a release's own pipeline plan (families/pp_plan.py), and the LLM recipes.

Toy classes stand in for a config and a model (the reader names no family); the real LLM recipes are
planned by partition-model in a process whose transformers is 5.23.0, as a user runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import load_script
from support import REPO
from torch import nn

from common.errors import UserError
from families import pp_plan
from families.definition import ChainEntry, ClassInfo, SharedWeight
from families.registry import definitions
from families.sections import AbsentEntry, PlanEntry
from families.shapes import shape_kwargs

installer = load_script("install_releases")


class ToyConfig:
    base_model_pp_plan = {"embed_tokens": (["input_ids"], ["inputs_embeds"]),
                          "layers": (["hidden_states"], ["hidden_states"]), "norm": (["hidden_states"], ["hidden_states"])}


class ToyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens, self.layers, self.norm = nn.Embedding(5, 2), nn.ModuleList([nn.Linear(2, 2)] * 2), nn.Identity()


class ToyForCausalLM(nn.Module):
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}
    _tied_weights_keys = ["lm_head.weight"]  # 4.x: tied to the input embeddings

    def __init__(self) -> None:
        super().__init__()
        self.model, self.lm_head = ToyModel(), nn.Linear(2, 5, bias=False)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens


def test_the_chain_is_the_base_plan_then_the_class_plan() -> None:
    chain = pp_plan.read_chain(ToyConfig, {"ToyModel": ToyModel, "ToyForCausalLM": ToyForCausalLM},
                               ToyForCausalLM(), "model", (("0",),))
    assert chain == (ChainEntry(name="embed_tokens", modules=("embed_tokens",)),
                     ChainEntry(layers="layers", sublayers=(("0",),)), ChainEntry(name="norm", modules=("norm",)),
                     ChainEntry(name="lm_head", modules=("lm_head",), root=True))


def test_a_config_without_a_plan_or_a_plan_naming_no_module_is_one_line() -> None:
    with pytest.raises(UserError, match="declares no base_model_pp_plan"):
        pp_plan.read_chain(object, {}, ToyForCausalLM(), "model")
    with pytest.raises(UserError, match="names 'embed_tokens', which ToyModel has not at model.embed_tokens"):
        pp_plan.read_chain(ToyConfig, {}, ToyModel(), "model")


def test_tied_keys_list_and_dict() -> None:
    assert pp_plan.tied_keys(ToyForCausalLM, ToyForCausalLM()) == {"lm_head.weight": "model.embed_tokens.weight"}

    class Five(ToyForCausalLM):
        _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}  # type: ignore[assignment]
    assert pp_plan.tied_keys(Five) == {"lm_head.weight": "model.embed_tokens.weight"}
    assert pp_plan.tied_keys(ToyModel) == {}


def test_a_recipe_tying_other_than_the_source_is_refused() -> None:
    info = ClassInfo("ToyForCausalLM", "loss", "model")
    tied = {"lm_head.weight": "model.embed_tokens.weight"}
    pp_plan.check_tied("toy.toml", info, (SharedWeight("w", "model.embed_tokens", ("model.embed_tokens",), "lm_head",
                                                       "tie_word_embeddings"),), tied)
    with pytest.raises(UserError, match="ties nothing in ToyForCausalLM, but its _tied_weights_keys say"):
        pp_plan.check_tied("toy.toml", info, (SharedWeight("w", "model.embed_tokens", ("model.embed_tokens",)),), tied)


def test_llm_recipes_read_their_chain_and_name_their_published_shapes() -> None:
    found = definitions()
    assert {name: found[name].chain_from for name in ("llama", "qwen2", "qwen3", "mistral")} == dict.fromkeys(
        ("llama", "qwen2", "qwen3", "mistral"), "pp_plan")
    assert set(found["llama"].shapes) == {"llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "tiny"}
    assert set(found["qwen3"].shapes) == {"qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-32b", "tiny"}
    with pytest.raises(UserError, match="read from a release's classes"):
        found["llama"].entries("LlamaForCausalLM")  # never an empty chain: only ModelFamily reads it


def test_partition_model_plans_llama_on_meta_and_refuses_ipu(tmp_path) -> None:  # noqa: ANN001
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installer.install_dir("5.23.0")), str(REPO)])}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "partitioning.cli", "llama", "--version", "5.23.0", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    planned = cli("--stages", "4", "--shape", "llama-3.2-1b", "--output", "plan.json")
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "embed_tokens .. " in planned.stdout and ".. lm_head" in planned.stdout
    assert "recomputed, not sent: model:float32[8, 1, 2048, 2048]" in planned.stdout  # the causal mask
    assert "recomputed, not sent: model.rotary_emb:float32[1, 2048, 64]" in planned.stdout  # cos and sin
    refused = cli("--stages", "2", "--target", "ipu")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.splitlines() == [refused.stderr.strip()] and \
        refused.stderr.startswith("partition-model: error: IPU is not supported for the llama family")


def test_a_release_declaring_no_plan_reads_the_recipes_and_one_declaring_its_own_refuses_it() -> None:
    stand_in = PlanEntry(versions="<4.47", base=("embed_tokens", "layers", "norm"), heads=("lm_head",))
    chain = pp_plan.read_chain(object, {"ToyForCausalLM": nn.Module}, ToyForCausalLM(), "model", (("0",),), stand_in)
    assert chain == pp_plan.read_chain(ToyConfig, {"ToyModel": ToyModel, "ToyForCausalLM": ToyForCausalLM},
                                       ToyForCausalLM(), "model", (("0",),))
    with pytest.raises(UserError, match=r"declares a base_model_pp_plan: the recipe's \[\[pipeline.plans\]\] for "
                                        "'<4.47' must not cover this release"):
        pp_plan.read_chain(ToyConfig, {}, ToyForCausalLM(), "model", (), stand_in)
    assert stand_in.covers("4.46.3") and not stand_in.covers("4.51.3")


def test_shape_keys_an_older_config_lacks_are_left_out_only_where_its_model_agrees() -> None:
    # argparse.Namespace() has no attributes: every key is one the "config class" lacks.
    absent = (AbsentEntry(versions="<4.47", equal={"mlp_bias": False}, quotient={"head_dim": ("hidden", "heads")}),)
    definition = SimpleNamespace(config_class="Namespace", config_path="argparse.Namespace", absent_keys=absent,
                                 shapes={"ok": {"hidden": 8, "heads": 2, "head_dim": 4, "mlp_bias": False},
                                         "wide": {"hidden": 8, "heads": 2, "head_dim": 8}})
    assert shape_kwargs(definition, "ok", "4.40.2") == ({"hidden": 8, "heads": 2}, ["hidden", "heads"])
    assert shape_kwargs(definition, "ok", "4.51.3")[1] == ["hidden", "heads", "head_dim", "mlp_bias"]
    with pytest.raises(UserError, match="shape wide sets head_dim = 8, but the Namespace of release 4.40.2 has no "
                                        r"head_dim and its model derives hidden // heads = 4"):
        shape_kwargs(definition, "wide", "4.40.2")


def test_a_per_layer_list_an_older_config_derives_from_a_period_becomes_the_period() -> None:
    """Gemma 3 before layer_types: the shape's list becomes sliding_window_pattern, only where one period gives it."""
    absent = (AbsentEntry(versions="<4.53", period={"layer_types": ("sliding_window_pattern", "full")}),)
    every_third = ["sliding", "sliding", "full", "sliding", "sliding", "full", "sliding"]
    definition = SimpleNamespace(config_class="Namespace", config_path="argparse.Namespace", absent_keys=absent,
                                 shapes={"third": {"layers": 7, "layer_types": every_third},
                                         "none": {"layer_types": ["sliding", "sliding"]},
                                         "odd": {"layer_types": ["sliding", "full", "full"]}})
    assert shape_kwargs(definition, "third", "4.51.3") == ({"layers": 7, "sliding_window_pattern": 3}, ["layers"])
    assert shape_kwargs(definition, "none", "4.51.3") == ({"sliding_window_pattern": 3}, [])
    assert shape_kwargs(definition, "third", "4.57.6")[1] == ["layers", "layer_types"]  # the entry does not cover it
    with pytest.raises(UserError, match=r"shape odd sets layer_types = .*: it places 'full' every k-th layer, and "
                                        "no k gives this list"):
        shape_kwargs(definition, "odd", "4.51.3")


@pytest.mark.parametrize(("family", "release"), [("llama", "4.40.2"), ("qwen2", "4.46.3"), ("gemma3", "4.51.3")])
def test_partition_model_plans_releases_declaring_no_plan(family: str, release: str, tmp_path) -> None:  # noqa: ANN001
    """4.40/4.46 declare no pp_plan: the LLM base's [[pipeline.plans]] stands in; head_dim/mlp_bias are left out."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(installer.install_dir(release)), str(REPO)])}
    planned = subprocess.run([sys.executable, "-m", "partitioning.cli", family, "--version", release, "--stages", "4",
                              "--output", "plan.json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
    assert planned.returncode == 0, planned.stderr[-2000:]
    assert "embed_tokens .. " in planned.stdout and ".. lm_head" in planned.stdout
    # The causal mask is a value the stages may recompute from attention_mask instead of receiving it (whether
    # they do is the solver's trade of its send time against the stage costs: Gemma 3's plan here sends it).
    values = {value["key"]: value for value in json.loads((tmp_path / "plan.json").read_text())["values"]}
    mask = values["model:float32[8, 1, 2048, 2048]"]
    assert mask["recompute"] is not None and [name for name, _ in mask["recompute"]["inputs"]] == ["attention_mask"]
