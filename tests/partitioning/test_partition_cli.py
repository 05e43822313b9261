"""``partition-model``: the table, the plan file, the plot, the placement, and one-line errors with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from support.t5_models import config

from families.installed import SIDE_BY_SIDE
from partitioning.cli import main
from partitioning.plan import Plan


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(config("2layer-gelu-tied").to_json_string())
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


BASE = ["t5", "--version", "4.5.1", "--batch", "2", "--source-len", "7", "--target-len", "5"]


def test_prints_the_table_and_writes_a_plan_that_round_trips(tiny: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code, stdout, stderr = run(BASE + ["--stages", "3", "--config", str(tiny), "--output", str(out),
                                       "--granularity", "1"], capsys)
    assert (code, stderr) == (0, "")
    plan = Plan.from_json(out.read_text())
    plan.validate()
    assert len(plan.stages) == 3 and len(plan.blocks) == 2 + 3 + 5  # 2 encoder and 3 decoder layers
    assert plan.model["granularity"] == 1
    assert plan.model["class"] == "T5ForConditionalGeneration" and plan.model["config"]["d_model"] == 16
    assert plan.settings["micro_batches"] == 8 and plan.settings["schedule"] == "1f1b"
    assert f"bottleneck / ideal {plan.ratio:.3f}" in stdout
    for stage in plan.stages:
        assert f" {stage.compute * 1e3:.4g} " in stdout and stage.blocks[0] in stdout
    assert not list(tmp_path.glob(".plan.json.*"))  # the atomic write left no temporary file


def test_plot_and_module_to_device_outputs(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png, placement = tmp_path / "plan.json", tmp_path / "plan.png", tmp_path / "placement.json"
    code, stdout, _ = run(BASE + ["--stages", "2", "--config", str(tiny), "--output", str(out), "--plot", str(png),
                                  "--module-to-device", str(placement)], capsys)
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    mapping = json.loads(placement.read_text())
    plan = Plan.from_json(out.read_text())
    assert mapping[""] == "cuda:0" and set(mapping.values()) == {"cuda:0", "cuda:1"}
    for stage in plan.stages:
        block = next(b for b in plan.blocks if b.name == stage.blocks[0])
        assert mapping[block.first_module] == f"cuda:{stage.index}"
    code, stdout, _ = run(BASE + ["--stages", "2", "--config", str(tiny), "--output", str(out),
                                  "--module-to-device"], capsys)
    assert json.loads(stdout[stdout.index("{"):stdout.rindex("}") + 1]) == mapping  # printed when no file is named


def test_encoder_only_class_and_granularity(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code, _, _ = run(BASE + ["--stages", "2", "--config", str(tiny), "--class", "T5EncoderModel",
                             "--granularity", "2", "--schedule", "gpipe", "--output", str(out)], capsys)
    assert code == 0
    assert [b.name for b in Plan.from_json(out.read_text()).blocks] == ["encoder.embed", "encoder.block.0-1",
                                                                        "encoder.final"]


@pytest.mark.parametrize("extra,message", [
    (["--stages", "11", "--granularity", "1"], "cannot split 10 blocks into 11 stages"),
    (["--stages", "19"], "cannot split 18 blocks into 19 stages"),  # auto: neither granularity has enough
    (["--stages", "2", "--granularity", "fine"],
     "argument --granularity: expected 'auto', 'sublayer' or a positive number of layers per block, got 'fine'"),
    (["--stages", "0"], "argument --stages: expected a positive integer, got '0'"),
    (["--stages", "2", "--class", "T5ForEverything"], "unknown class 'T5ForEverything'"),
    (["--stages", "2", "--memory-gb", "0.000001"], "no split into 2 stages fits 1000 B per device"),
    (["--stages", "2", "--schedule", "interleaved"], "unknown schedule 'interleaved'"),
    (["--stages", "2", "--measure", "2"], "--measure needs a real --device"),
    (["--stages", "2", "--class", "T5Model", "--run"], "--run trains, so it needs T5ForConditionalGeneration"),
])
def test_bad_plans_exit_2_with_one_line(extra: list[str], message: str, tiny: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code, stdout, stderr = run(BASE + ["--config", str(tiny), "--output", str(out)] + extra, capsys)
    assert code == 2 and stdout == ""
    assert stderr.startswith("partition-model: error: ") and message in stderr and stderr.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("argv,message", [
    (["t5", "--version", "4.5.1", "--stages", "2", "--shape", "t5-xxl"], "unknown shape 't5-xxl'"),
    (["nosuch", "--version", "4.5.1", "--stages", "2"], "unknown family 'nosuch'"),
    (["t5", "--version", "9.9.9", "--stages", "2", "--config", "{tiny}"], "no generated model"),
    (["t5", "--version", "4.5.1", "--stages", "2", "--config", "{missing}"], "cannot read config"),
])
def test_bad_inputs_exit_2_with_one_line(argv: list[str], message: str, tiny: Path, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    argv = [a.format(tiny=tiny, missing=tmp_path / "missing.json") for a in argv]
    code, _, stderr = run(argv + ["--output", str(tmp_path / "plan.json")], capsys)
    assert code == 2 and message in stderr and stderr.count("\n") == 1


def test_a_release_whose_package_is_not_installed_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Generated code imports its own release's transformers: .venv has 4.5.1, 4.57.6's package needs cache_utils.

    (tests/test_t5_releases.py plans every committed release in a process importing that release.)
    """
    code, out, err = run(["t5", "--version", "4.57.6", "--stages", "2", "--shape", "tiny",
                          "--output", str(tmp_path / "plan.json")], capsys)
    assert code == 2 and not (tmp_path / "plan.json").exists()
    assert err.strip().startswith(
        "partition-model: error: generated_models.t5.v4_57_6 (generated from transformers 4.57.6) needs transformers "
        "4.57.6, but the one that imports here is transformers 4.5.1 (")
    install = SIDE_BY_SIDE / "4.57.6"
    assert err.strip().endswith(f"(hint: PYTHONPATH={install} before the command runs it with transformers 4.57.6; "
                                f"or partition-model t5 --version 4.5.1 plans the release here)")


def test_the_hint_for_another_release_works_from_another_directory(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The hint's PYTHONPATH is absolute: the command it names plans 4.57.6 run from anywhere."""
    code, _, err = run(["t5", "--version", "4.57.6", "--stages", "2", "--shape", "tiny", "--output",
                        str(tmp_path / "plan.json")], capsys)
    hinted = err.split("(hint: PYTHONPATH=", 1)[1].split(" before the command", 1)[0]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([hinted, str(REPO)])}  # this checkout's tools, as installed
    done = subprocess.run([sys.executable, "-m", "partitioning", "t5", "--version", "4.57.6", "--stages", "2",
                           "--shape", "tiny", "--output", "plan.json"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert code == 2 and done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "plan.json").read_text())["model"]["version"] == "4.57.6"
def test_auto_granularity_and_recomputation_are_recorded_and_can_be_turned_off(
        tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    argv = BASE + ["--stages", "2", "--config", str(tiny), "--output", str(out), "--micro-batches", "2"]
    code, stdout, _ = run(argv + ["--granularity", "sublayer"], capsys)
    plan = Plan.from_json(out.read_text())
    assert code == 0 and plan.model["granularity"] == "sublayer"
    assert "encoder.block.0.layer.0" in [b.name for b in plan.blocks]
    assert plan.values and plan.recomputed  # the tiny model's masks and biases cost less to recompute
    assert all(stage.send_bytes is not None for stage in plan.stages)
    for key in {key for stage in plan.stages for key in stage.recompute}:
        assert f"recomputed, not sent: {key}" in stdout
    code, stdout, _ = run(argv + ["--no-recompute"], capsys)
    plan = Plan.from_json(out.read_text())
    assert code == 0 and plan.recomputed == [] and all(stage.recompute == () for stage in plan.stages)
    assert plan.model["granularity"] in (1, "sublayer") and "recomputed, not sent" not in stdout
