"""train-model never trains or saves NaN: a data file with nothing to learn is refused before the ranks start, a
checkpoint weight that is NaN or infinite is refused by the rank loading it, and a step whose loss is not finite
stops the run in one line naming the step, before its optimizer step and before anything is saved.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_train_model import save_checkpoint, write_data, write_plan

from common.errors import UserError
from families.checkpoint import Checkpoint
from partitioning.train.cli import main


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nonfinite")
    cfg = save_checkpoint("t5", root / "t5")
    write_plan("t5", cfg, "encoder.block.1", "gpipe", root / "plan.json")
    write_data(root / "data.jsonl", root / "plan.json")
    gpt2 = save_checkpoint("gpt2", root / "gpt2")
    write_plan("gpt2", gpt2, "transformer.h.2", "gpipe", root / "gpt2.json")
    return {"root": root, "checkpoint": root / "t5", "plan": root / "plan.json", "data": root / "data.jsonl",
            "gpt2": root / "gpt2", "gpt2_plan": root / "gpt2.json"}


def refused(capsys: pytest.CaptureFixture[str], argv: list[str | Path]) -> str:
    code = main([str(part) for part in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("train-model: error: "), err
    return err


def t5_examples(path: Path, labels: list[list[int]]) -> Path:
    path.write_text("".join(json.dumps({"input_ids": [3, 4, 1], "decoder_input_ids": [0, 5, 6], "labels": label})
                            + "\n" for label in labels))
    return path


def test_a_data_file_with_nothing_to_learn_is_refused(setup: dict[str, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    ignored = t5_examples(setup["root"] / "ignored.jsonl", [[-100, -100, -100]] * 4)
    err = refused(capsys, ["--plan", setup["plan"], "--checkpoint", setup["checkpoint"], "--data", ignored,
                           "--steps", "1"])
    assert "no example has a label to learn (every label is -100)" in err, err
    # a causal LM shifts its labels: the first token of a sequence is never predicted
    single = setup["root"] / "single.jsonl"
    single.write_text("".join(json.dumps({"input_ids": [token], "labels": [token]}) + "\n" for token in range(4)))
    err = refused(capsys, ["--plan", setup["gpt2_plan"], "--checkpoint", setup["gpt2"], "--data", single,
                           "--steps", "1"])
    assert "which the causal LM shifts away" in err, err


def with_weight(setup: dict[str, Path], name: str, key: str, value: float) -> Path:
    directory = setup["root"] / name
    directory.mkdir()
    shutil.copy(setup["checkpoint"] / "config.json", directory)
    state = torch.load(setup["checkpoint"] / "pytorch_model.bin", weights_only=True)
    state[key] = state[key].clone()
    state[key].view(-1)[1] = value
    torch.save(state, directory / "pytorch_model.bin")
    return directory


def test_a_weight_that_is_not_finite_is_refused_where_it_is_loaded(setup: dict[str, Path]) -> None:
    key = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight"
    infinite = Checkpoint(with_weight(setup, "inf", key, float("inf")))
    with pytest.raises(UserError, match=f"{key} holds an infinite value"):
        infinite.load([key])
    assert Checkpoint(setup["checkpoint"]).load([key])[key].isfinite().all()


def test_a_nan_weight_stops_the_run_in_the_rank_that_loads_it(setup: dict[str, Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    key = "decoder.block.1.layer.2.DenseReluDense.wo.weight"  # stage 1's
    nan = with_weight(setup, "nan", key, float("nan"))
    out = setup["root"] / "nan-out"
    err = refused(capsys, ["--plan", setup["plan"], "--checkpoint", nan, "--data", setup["data"], "--steps", "1",
                           "--save", out])
    assert "(rank 1): error: checkpoint" in err and f"{key} holds NaN" in err, err
    assert not out.exists() or not any(out.rglob("*.safetensors"))


def test_a_step_whose_loss_is_nan_stops_before_anything_is_saved(setup: dict[str, Path],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Three of a step's four examples ignore every label: one of its two micro-batches has nothing to average, its
    loss is 0 / 0.  The file as a whole has a label to learn, so it is accepted; the run stops at step 1."""
    data = t5_examples(setup["root"] / "mostly-ignored.jsonl", [[5, 6, 1]] + [[-100, -100, -100]] * 3)
    out = setup["root"] / "nan-loss"
    err = refused(capsys, ["--plan", setup["plan"], "--checkpoint", setup["checkpoint"], "--data", data,
                           "--steps", "2", "--save", out])
    assert "error: step 1: the loss is NaN" in err and "nothing of it saved" in err, err
    assert not out.exists() or not any(out.rglob("*.safetensors"))
