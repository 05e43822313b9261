"""The checkpoint's config is the one trained: the plan's is compared with it field by field.

Sizes and tying must match; any other difference (dropout, eps, activation, token ids) is refused in one line
naming each field, or with --config-from-checkpoint trained from the checkpoint's value with a warning naming each
field, equal to the checkpoint's model in one process, and saved as trained.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from support.train_runs import OPTIONS, STEPS
from test_train_model import assert_saved_equals, reference, save_checkpoint, write_data, write_plan

from partitioning.train.cli import main


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("config")
    cfg = save_checkpoint("gpt2", root / "gpt2")
    write_plan("gpt2", cfg, "transformer.h.2", "gpipe", root / "plan.json")
    write_data(root / "data.jsonl", root / "plan.json")
    return {"root": root, "checkpoint": root / "gpt2", "plan": root / "plan.json", "data": root / "data.jsonl"}


def changed(setup: dict[str, Path], name: str, **fields: Any) -> Path:
    """The checkpoint with ``fields`` set in its config.json (the weights as they are)."""
    directory = setup["root"] / name
    shutil.copytree(setup["checkpoint"], directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **fields}))
    return directory


def run(setup: dict[str, Path], capsys: pytest.CaptureFixture[str], checkpoint: Path, *extra: str) -> tuple[int, str]:
    code = main(["--plan", str(setup["plan"]), "--checkpoint", str(checkpoint), "--data", str(setup["data"]),
                 "--steps", "1", *extra])
    return code, capsys.readouterr().err


def refused(setup: dict[str, Path], capsys: pytest.CaptureFixture[str], checkpoint: Path, *extra: str) -> str:
    code, err = run(setup, capsys, checkpoint, *extra)
    assert code == 2 and err.count("\n") == 1 and err.startswith("train-model: error: "), err
    return err


def test_each_field_that_differs_is_named(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    other = changed(setup, "other", layer_norm_epsilon=1e-3, resid_pdrop=0.1, activation_function="gelu_new")
    err = refused(setup, capsys, other)
    for field in ("layer_norm_epsilon (checkpoint 0.001; the plan 1e-05)", "resid_pdrop (checkpoint 0.1; the plan "
                  "0.0)", "activation_function (checkpoint 'gelu_new'; the plan 'relu')", "--config-from-checkpoint"):
        assert field in err, err


def test_sizes_and_tying_must_match_even_with_the_flag(setup: dict[str, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    untied = changed(setup, "untied", tie_word_embeddings=False)
    assert "has tie_word_embeddings = False, the plan True" in refused(setup, capsys, untied, "--config-from-checkpoint")
    # the config says tied, the file holds a head of its own: an untied model's weights
    own_head = setup["root"] / "own-head"
    shutil.copytree(setup["checkpoint"], own_head)
    state = torch.load(own_head / "pytorch_model.bin", weights_only=True)
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    torch.save(state, own_head / "pytorch_model.bin")
    err = refused(setup, capsys, own_head)
    assert "holds transformer.wte.weight and lm_head.weight with different values, which the plan ties" in err, err


def test_with_the_flag_the_checkpoints_values_are_trained_and_saved(setup: dict[str, Path],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """eps and activation from the checkpoint: the saved weights equal the checkpoint's own model trained in one
    process, and the saved config.json holds the checkpoint's values."""
    other = changed(setup, "trained", layer_norm_epsilon=1e-3, activation_function="gelu_new")
    out = setup["root"] / "out"
    code = main(["--plan", str(setup["plan"]), "--checkpoint", str(other), "--data", str(setup["data"]),
                 "--steps", str(STEPS), "--save", str(out), "--config-from-checkpoint", *OPTIONS])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.startswith("train-model: warning: training the checkpoint's config") and err.count("\n") == 1, err
    assert "layer_norm_epsilon (checkpoint 0.001; the plan 1e-05)" in err and "activation_function" in err, err
    saved = json.loads((out / "config.json").read_text())
    assert saved["layer_norm_epsilon"] == 1e-3 and saved["activation_function"] == "gelu_new", saved
    assert_saved_equals("gpt2", out, reference("gpt2", other, setup["plan"], setup["data"], STEPS))
