"""train-model --config-file TOML: every flag as a setting, the command line over it, the run's own settings echoed
into the save directory as a file of the same form (the save itself: tests/partitioning/test_train_resume.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from partitioning.train.cli import main
from partitioning.train.request import parse, settings_text

ARGV = ["--plan", "plan.json", "--checkpoint", "my-t5", "--data", "train.jsonl", "--steps", "10", "--save", "out",
        "--lr", "0.0001", "--betas", "0.9,0.99", "--decay", "cosine", "--clip-grad", "1.0", "--decay-all-parameters",
        "--tensorboard", "runs/one", "--seed", "3"]


def test_a_run_s_settings_make_the_same_run_again(tmp_path: Path) -> None:
    request = parse(ARGV)
    settings = tmp_path / "run.toml"
    settings.write_text(settings_text(request))
    assert 'lr = 0.0001' in settings.read_text() and "betas = [0.9, 0.99]" in settings.read_text()
    assert parse(["--config-file", str(settings)]) == replace(request, config_file=settings)


def test_the_command_line_overrides_the_file(tmp_path: Path) -> None:
    settings = tmp_path / "run.toml"
    settings.write_text('plan = "plan.json"\ncheckpoint = "my-t5"\ndata = "train.jsonl"\nsteps = 10\nlr = 0.1\n'
                        'weight_decay = 0.01\nbetas = [0.8, 0.9]\nverbose = true\ndecay-all-parameters = false\n')
    request = parse(["--config-file", str(settings), "--lr", "0.2", "--steps", "20"])
    assert (request.lr, request.steps, request.weight_decay, request.betas) == (0.2, 20, 0.01, (0.8, 0.9))
    assert request.verbose and not request.decay_all_parameters and request.plan == Path("plan.json")


def test_the_command_line_s_span_replaces_the_file_s(tmp_path: Path) -> None:
    """--steps and --epochs exclude each other: either on the command line replaces the file's."""
    settings = tmp_path / "run.toml"
    settings.write_text('plan = "p.json"\ncheckpoint = "c"\ndata = "d"\nepochs = 2.5\n')
    assert (parse(["--config-file", str(settings)]).epochs, parse(["--config-file", str(settings)]).steps) == (2.5, None)
    request = parse(["--config-file", str(settings), "--steps", "5"])
    assert (request.steps, request.epochs) == (5, None)
    request = parse(["--config-file", str(settings), "--epochs=1"])
    assert (request.steps, request.epochs) == (None, 1.0)


@pytest.mark.parametrize("text,expected", [
    ("learning_rate = 0.1\n", "unknown setting 'learning_rate' (train-model has no --learning-rate)"),
    ("config-file = 'other.toml'\n", "unknown setting 'config-file'"),
    ("decay-all-parameters = 1\n", "decay-all-parameters = 1: expected true or false"),
    ("lr = true\n", "lr = True: expected a value"),
    ("[optimizer]\nlr = 0.1\n", "unknown setting 'optimizer' (train-model has no --optimizer)"),
    ("lr = \n", "--config-file"),
    ("steps = 'ten'\n", "argument --steps: expected an integer, got 'ten'"),
    ("steps = 3\nepochs = 1\n", "argument --epochs: not allowed with argument --steps"),
])
def test_a_bad_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str) -> None:
    settings = tmp_path / "run.toml"
    settings.write_text(text)
    required = ["--plan", "p.json", "--checkpoint", "c", "--data", "d", *([] if "steps" in text else ["--steps", "1"])]
    code, err = main(["--config-file", str(settings), *required]), capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("train-model: error: "), err
    assert expected in err, err


def test_a_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config-file", str(tmp_path / "absent.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "absent.toml" in err, err
