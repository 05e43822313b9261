"""``--resume`` continues the saved run exactly, or is refused in one line before any rank starts.

The optimizer's and the schedule's state are restored as saved, so a new --lr (or weight decay, betas, eps,
warm-up, decay) would be ignored; a new --seed or --micro-batches would change the data order, another --steps
the span of the lr schedule, and a plan cut elsewhere the stages the saved state belongs to.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from test_train_model import save_checkpoint, write_data, write_plan

from partitioning.train.cli import epoch_steps, main
from partitioning.train.layout import SETTINGS
from partitioning.train.request import parse


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 2-stage T5 run of 1 step of a 2-step schedule, saved (one torchrun launch): half a pass over the 7
    examples, 4 a step (2 micro-batches of 2), is --epochs 0.5, one step."""
    root = tmp_path_factory.mktemp("resume")
    cfg = save_checkpoint("t5", root / "t5")
    write_plan("t5", cfg, "encoder.block.1", "gpipe", root / "plan.json")
    write_plan("t5", cfg, "decoder.embed", "gpipe", root / "elsewhere.json")
    write_data(root / "data.jsonl", root / "plan.json")
    out = root / "out"
    argv = ["--plan", str(root / "plan.json"), "--checkpoint", str(root / "t5"), "--data", str(root / "data.jsonl"),
            "--epochs", "0.5", "--decay-steps", "2", "--lr", "0.01", "--save", str(out)]
    assert main(argv) == 0
    (root / "argv.json").write_text(json.dumps(argv))
    return {"root": root, "plan": root / "plan.json", "data": root / "data.jsonl", "out": out}


def test_the_save_holds_its_run_s_settings(saved: dict[str, Path]) -> None:
    """DIR/train_config.toml, given back as --config-file, is the run's request again."""
    echoed = saved["out"] / SETTINGS
    again = parse(["--config-file", str(echoed)])
    assert again == replace(parse(json.loads((saved["root"] / "argv.json").read_text())), config_file=echoed)


@pytest.mark.parametrize("changes,expected", [
    ({"--seed": "1"}, "continues a run of --seed 0; this one has 1"),
    ({"--lr": "0.02"}, "continues a run of --lr 0.01; this one has 0.02"),
    ({"--weight-decay": "0.1"}, "continues a run of --weight-decay 0.0; this one has 0.1"),
    ({"--decay-all-parameters": ""}, "continues a run of --decay-all-parameters False; this one has True"),
    ({"--decay-steps": None}, "continues a run of --decay-steps (else --steps) 2; this one has 3"),
    ({"--micro-batches": "1"}, "continues a run of --micro-batches 2; this one has 1"),
    ({"--plan": "elsewhere"}, "continues a run of the plan's cuts"),
])
def test_a_resume_that_would_change_the_run_is_refused(saved: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                                       changes: dict[str, str | None], expected: str) -> None:
    options: dict[str, str | None] = {"--plan": str(saved["plan"]), "--resume": str(saved["out"]),
                                      "--data": str(saved["data"]), "--steps": "3", "--decay-steps": "2",
                                      "--lr": "0.01", **changes}
    if options["--plan"] == "elsewhere":
        options["--plan"] = str(saved["root"] / "elsewhere.json")
    before = (saved["out"] / "train_state.json").read_text()
    code = main([part for key, value in options.items() if value is not None  # "": a flag without a value
                 for part in ((key,) if value == "" else (key, value))])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("train-model: error: --resume "), err
    assert expected in err, err
    assert json.loads((saved["out"] / "train_state.json").read_text())["step"] == 1
    assert (saved["out"] / "train_state.json").read_text() == before


def test_a_resume_past_its_epochs_is_refused(saved: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--plan", str(saved["plan"]), "--resume", str(saved["out"]), "--data", str(saved["data"]),
                 "--epochs", "0.5", "--decay-steps", "2", "--lr", "0.01"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1, err
    assert "is at step 1: --epochs 0.5 (1 steps) leaves nothing to do" in err, err
    assert "train-model: --epochs 0.5 of 7 examples at 4 a step: 1 steps\n" in out, out


@pytest.mark.parametrize("epochs,examples,per_step,steps,beyond", [
    (1, 8, 4, 2, None), (2, 7, 4, 4, 2), (0.5, 7, 4, 1, None), (0.1, 7, 4, 1, 3), (3, 3, 2, 5, 1),
    (0.3, 10, 1, 3, None),  # 0.3 x 10 is 3.0000000000000004 in floats: still 3 examples
])
def test_epochs_are_rounded_up_to_whole_steps(capsys: pytest.CaptureFixture[str], epochs: float, examples: int,
                                              per_step: int, steps: int, beyond: int | None) -> None:
    assert epoch_steps(epochs, examples, per_step) == steps
    said = capsys.readouterr().out
    assert said.startswith(f"train-model: --epochs {epochs:g} of {examples} examples at {per_step} a step: "
                           f"{steps} steps"), said
    assert (f"its last {beyond} examples come from the next pass" in said) == (beyond is not None), said
