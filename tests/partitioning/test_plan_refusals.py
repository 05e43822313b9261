"""What a run could only find out late is refused before the slow work, in one line, exit 2, nothing written.

partition-model: a rotary scaling no traced stage can run (``dynamic``, which used to end in "internal error:
TraceError") or an invalid one (unknown type, missing or negative factor: "internal error" or a silent plan); a
check of the model's own refusing the planned batch (GPT2ForSequenceClassification at batch 2 with no pad token:
"internal error: AssertionError"); ``--run --timeline`` into a place no file can be created (found after the run).
train-model: ``--save`` under a regular file or into a directory no file can be created in, a config
``pad_token_id`` outside the vocabulary, ``--micro-batches`` 0, negative or 100000 (found in the ranks before).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import transformers
from support import REPO
from test_train_model import save_checkpoint, write_data, write_plan

from common.atomic import cannot_create_in
from common.errors import UserError
from families.shapes import check_rope
from partitioning import cli
from partitioning.train.cli import main as train_main

LLM_RELEASE = REPO / ".venv" / "transformers" / "4.57.6"


def one_line(code: int, err: str, prog: str) -> str:
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"{prog}: error: "), err
    return err


def unwritable(tmp_path: Path) -> Path:
    """A directory in which no file can be created: read-only by its mode, or (root ignores modes) /sys."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    directory.chmod(0o555)
    if cannot_create_in(directory) is None:
        directory = Path("/sys")
    assert cannot_create_in(directory) is not None
    return directory


@pytest.mark.parametrize("scaling,expected", [
    ({"rope_type": "dynamic", "factor": 2.0}, "rope_type 'dynamic' recomputes the rotary frequencies"),
    ({"type": "longrope", "factor": 2.0}, "rope_type 'longrope' recomputes"),
    ({"rope_type": "bogus", "factor": 2.0}, "unknown rope_type 'bogus'"),
    ({"rope_type": "linear"}, "rope_type 'linear' needs factor"),
    ({"rope_type": "linear", "factor": -2.0}, "factor must be a number >= 1, got -2.0"),
    ({"rope_type": "llama3", "factor": 8.0}, "rope_type 'llama3' needs low_freq_factor"),
    ({"full_attention": {"rope_type": "yarn", "factor": 0.5}}, "rope_scaling.full_attention: factor must be"),
    ("linear", "must be an object"),
])
def test_rope_scalings_no_stage_can_run_are_named(scaling: object, expected: str) -> None:
    with pytest.raises(UserError, match=expected.replace("(", r"\(")):
        check_rope(scaling, "rope_scaling")


def test_static_rope_scalings_pass() -> None:
    for scaling in ({"rope_type": "linear", "factor": 2.0}, {"type": "yarn", "factor": 4},
                    {"rope_type": "default", "rope_theta": 1e6},  # 5.x's rope_parameters
                    {"sliding_attention": {"rope_type": "default"}, "full_attention": {"rope_type": "default"}}):
        check_rope(scaling, "rope_scaling")


@pytest.mark.skipif(not LLM_RELEASE.is_dir(), reason="the 4.57.6 install (scripts/setup.sh)")
def test_partition_model_refuses_dynamic_rope_before_tracing(tmp_path: Path) -> None:
    config = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(LLM_RELEASE), str(REPO)])}
    result = subprocess.run([sys.executable, "-m", "partitioning", "llama", "--version", "4.57.6", "--config",
                             str(tmp_path / "config.json"), "--stages", "2", "--batch", "2", "--seq-len",
                             "sequence=16", "--output", str(tmp_path / "plan.json")],
                            capture_output=True, text=True, env=env, timeout=600)
    assert "rope_scaling: rope_type 'dynamic' recomputes" in one_line(result.returncode, result.stderr,
                                                                      "partition-model")
    assert not (tmp_path / "plan.json").exists()


def test_a_check_of_the_model_refuses_the_planned_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=99, n_positions=32).to_dict()
    config.pop("pad_token_id")
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = tmp_path / "plan.json"
    base = ["gpt2", "--version", "4.5.1", "--config", str(tmp_path / "config.json"), "--class",
            "GPT2ForSequenceClassification", "--stages", "2", "--seq-len", "sequence=16", "--output", str(plan)]
    err = one_line(cli.main([*base, "--batch", "2"]), capsys.readouterr().err, "partition-model")
    assert "the model refuses the planned input: Cannot handle batch sizes > 1 if no padding token" in err, err
    assert not plan.exists()
    assert cli.main([*base, "--batch", "1"]) == 0 and plan.is_file()  # stock takes one row without a pad token


def test_a_timeline_nowhere_writable_is_refused_before_the_run(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    timeline = unwritable(tmp_path) / "timeline" / "t.json"
    plan = tmp_path / "plan.json"
    code = cli.main(["gpt2", "--version", "4.5.1", "--stages", "2", "--batch", "1", "--output", str(plan), "--run",
                     "--timeline", str(timeline)])
    assert "is not writable" in one_line(code, capsys.readouterr().err, "partition-model")
    assert not plan.exists()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("prelaunch")
    cfg = save_checkpoint("gpt2", root / "gpt2")
    write_plan("gpt2", cfg, "transformer.h.2", "gpipe", root / "plan.json")
    write_data(root / "data.jsonl", root / "plan.json")
    return {"root": root, "checkpoint": root / "gpt2", "plan": root / "plan.json", "data": root / "data.jsonl"}


def train(gpt2: dict[str, Path], capsys: pytest.CaptureFixture[str], *extra: str | Path, **changes: Path) -> str:
    options = {"--plan": gpt2["plan"], "--checkpoint": gpt2["checkpoint"], "--data": gpt2["data"],
               **{f"--{key}": value for key, value in changes.items()}}
    code = train_main([*(str(part) for pair in options.items() for part in pair), "--steps", "1",
                       *(str(part) for part in extra)])
    return one_line(code, capsys.readouterr().err, "train-model")


def test_train_model_refuses_before_launch(gpt2: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    assert "lies under" in train(gpt2, capsys, "--save", a_file / "out") and a_file.read_text() == "mine"
    assert "cannot write into" in train(gpt2, capsys, "--save", unwritable(tmp_path) / "out")
    for count in ("0", "-1"):
        assert "--micro-batches: expected a positive integer" in train(gpt2, capsys, "--micro-batches", count)
    assert "fewer than one step's batch of 200000" in train(gpt2, capsys, "--micro-batches", "100000")
    outside = tmp_path / "pad"
    outside.mkdir()
    for name in ("pytorch_model.bin", "config.json"):
        (outside / name).write_bytes((gpt2["checkpoint"] / name).read_bytes())
    config = json.loads((outside / "config.json").read_text())
    (outside / "config.json").write_text(json.dumps({**config, "pad_token_id": config["vocab_size"]}))
    write_plan("gpt2", transformers.GPT2Config.from_pretrained(outside), "transformer.h.2", "gpipe",
               tmp_path / "pad.json")  # GPT-2's embedding has no padding index: the plan is made
    err = train(gpt2, capsys, checkpoint=outside, plan=tmp_path / "pad.json")
    assert f"pad_token_id {config['vocab_size']} lies outside the vocabulary [0, {config['vocab_size']})" in err, err
