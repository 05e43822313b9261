"""train-model refuses bad input in one line and exit 2, before any rank starts; a rank's failure is one line too.

Checkpoints of another family or size, missing, extra or mis-shaped keys, a truncated safetensors file; data
files with wrong fields, types, lengths, or none (a head's labels: test_train_head_data.py); --save over a file or
a directory it did not write.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from support import REPO
from test_train_model import save_checkpoint, stock_class, write_data, write_plan

from common.atomic import is_temporary
from common.errors import UserError
from partitioning.train.cli import main
from partitioning.train.data import read_dataset
from partitioning.train.layout import METRICS
from partitioning.train.save import check_save_dir
from partitioning.train.stage import plan_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    cfg = save_checkpoint("t5", root / "t5")
    write_plan("t5", cfg, "encoder.block.1", "gpipe", root / "plan.json")
    write_data(root / "data.jsonl", root / "plan.json")
    save_checkpoint("gpt2", root / "gpt2")
    return {"root": root, "checkpoint": root / "t5", "plan": root / "plan.json", "data": root / "data.jsonl"}


def run(setup: dict[str, Path], capsys: pytest.CaptureFixture[str], **changes: object) -> str:
    options = {"--plan": setup["plan"], "--checkpoint": setup["checkpoint"], "--data": setup["data"], "--steps": "1",
               **{"--" + key.replace("_", "-"): value for key, value in changes.items()}}
    code = main([str(part) for pair in options.items() if pair[1] is not None for part in pair])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("train-model: error: "), err
    return err


def changed_checkpoint(setup: dict[str, Path], name: str, change) -> Path:
    directory = setup["root"] / name
    directory.mkdir()
    shutil.copy(setup["checkpoint"] / "config.json", directory)
    state = torch.load(setup["checkpoint"] / "pytorch_model.bin", weights_only=True)
    change(state)
    torch.save(state, directory / "pytorch_model.bin")
    return directory


def test_checkpoints_of_other_models(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert "is a 'gpt2' model, the plan a 't5' one" in run(setup, capsys, checkpoint=setup["root"] / "gpt2")
    bigger = setup["root"] / "bigger"
    shutil.copytree(setup["checkpoint"], bigger)
    config = json.loads((bigger / "config.json").read_text())
    (bigger / "config.json").write_text(json.dumps({**config, "d_ff": config["d_ff"] + 1}))
    assert f"has d_ff = {config['d_ff'] + 1}, the plan {config['d_ff']}" in run(setup, capsys, checkpoint=bigger)
    assert "is not a directory" in run(setup, capsys, checkpoint=setup["data"])


def test_missing_extra_and_misshaped_keys(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    key = "encoder.block.1.layer.1.DenseReluDense.wo.weight"
    missing = changed_checkpoint(setup, "missing", lambda state: state.pop(key))
    assert f"lacks {key}" in run(setup, capsys, checkpoint=missing)
    extra = changed_checkpoint(setup, "extra", lambda state: state.update({"encoder.block.9.x": torch.zeros(1)}))
    assert "has encoder.block.9.x, which a T5ForConditionalGeneration" in run(setup, capsys, checkpoint=extra)
    shaped = changed_checkpoint(setup, "shaped", lambda state: state.update({key: state[key].T.contiguous()}))
    assert f"has {key} of shape" in run(setup, capsys, checkpoint=shaped)


def test_truncated_safetensors(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    directory = setup["root"] / "truncated"
    directory.mkdir()
    shutil.copy(setup["checkpoint"] / "config.json", directory)
    state = torch.load(setup["checkpoint"] / "pytorch_model.bin", weights_only=True)
    save_file({key: value.contiguous() for key, value in state.items() if key != "lm_head.weight"
               and "embed_tokens" not in key}, str(directory / "model.safetensors"))
    data = (directory / "model.safetensors").read_bytes()
    (directory / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "is not a readable safetensors file" in run(setup, capsys, checkpoint=directory)
    (directory / "model.safetensors").write_bytes(data[:5])
    assert "is not a readable safetensors file" in run(setup, capsys, checkpoint=directory)


@pytest.mark.parametrize("lines,expected", [
    (['{"input_ids": [1, 2], "labels": [1]}'], "line 1: no 'decoder_input_ids'"),
    (['{"input_ids": [1], "decoder_input_ids": [1], "labels": [1], "text": "hi"}'], "line 1: unknown field 'text'"),
    (['{"input_ids": [1.5], "decoder_input_ids": [1], "labels": [1]}'], "line 1: input_ids must be a list of integers"),
    (['{"input_ids": "12", "decoder_input_ids": [1], "labels": [1]}'], "input_ids must be a list of integers"),
    (['{"input_ids": [1, 1, 1, 1, 1, 1, 1, 1], "decoder_input_ids": [1], "labels": [1]}'],
     "line 1: input_ids has 8 tokens, the plan's source length is 7"),
    (['{"input_ids": [1], "decoder_input_ids": [1, 2], "labels": [1]}'], "labels has 1 tokens, decoder_input_ids 2"),
    (['{"input_ids": [1], "decoder_input_ids": [1], "labels": [1]}', "[1]"], "line 2: an example is a JSON object"),
    (['{"input_ids": [1], "decoder_input_ids": [1], "labels": [1]}', "{"], "line 2: not JSON"),
    (['{"input_ids": [], "decoder_input_ids": [1], "labels": [1]}'], "input_ids is empty"),
    (['{"input_ids": [99999], "decoder_input_ids": [1], "labels": [1]}'], "input_ids holds 99999, outside [0, "),
    (["", " "], "holds no examples"),
    (['{"input_ids": [1], "decoder_input_ids": [1], "labels": [1]}'], "holds 1 examples, fewer than one step's"),
])
def test_bad_data(setup: dict[str, Path], capsys: pytest.CaptureFixture[str], lines: list[str], expected: str) -> None:
    data = setup["root"] / "bad.jsonl"
    data.write_text("\n".join(lines) + "\n")
    assert expected in run(setup, capsys, data=data)


def test_data_is_padded_and_masked(setup: dict[str, Path]) -> None:
    from partitioning.files import read_plan

    _, _, cfg, specs, micro_batch = plan_model(read_plan(setup["plan"]))
    data = setup["root"] / "short.jsonl"
    data.write_text('{"input_ids": [5, 6], "decoder_input_ids": [0, 7], "labels": [7, 8]}\n')
    dataset = read_dataset(data, specs, cfg, micro_batch, 1)
    assert dataset.tensors["input_ids"].tolist() == [[5, 6, 0, 0, 0, 0, 0]]
    assert dataset.tensors["attention_mask"].tolist() == [[1, 1, 0, 0, 0, 0, 0]]
    assert dataset.tensors["decoder_attention_mask"].tolist() == [[1, 1, 0, 0, 0]]
    assert dataset.tensors["labels"].tolist() == [[7, 8, -100, -100, -100]]
    first, second = dataset.batch(0, 1, seed=3), dataset.batch(0, 1, seed=3)
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_save_over_a_file_or_a_foreign_directory(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert "is a file: give a directory" in run(setup, capsys, save=setup["data"])
    foreign = setup["root"] / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert "is a directory train-model did not write" in run(setup, capsys, save=foreign)
    assert (foreign / "notes.txt").read_text() == "mine"
    assert "not a checkpoint train-model saved" in run(setup, capsys, resume=foreign, checkpoint=None)
    died = setup["root"] / "died"  # a run killed before its first save leaves its metrics only: not foreign
    died.mkdir()
    (died / METRICS).write_text('{"step": 1, "loss": 2.0}\n')
    check_save_dir(died)
    (foreign / METRICS).write_text("")
    with pytest.raises(UserError, match="is a directory train-model did not write"):
        check_save_dir(foreign)


def test_options(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert "give --checkpoint DIR" in run(setup, capsys, resume=setup["checkpoint"])
    assert "--save-every needs --save" in run(setup, capsys, save_every="2")
    assert "give --save-every N" in run(setup, capsys, save=setup["root"] / "limited", save_total_limit="2")
    assert "--betas" in run(setup, capsys, betas="0.9")


def test_several_stages_per_rank(setup: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Two chunks on one rank: refused where the schedule places them otherwise, and with data parallelism under
    a schedule that splits the backward (zero bubble)."""
    looped = setup["root"] / "looped.json"
    looped.write_text(json.dumps({**json.loads(setup["plan"].read_text()), "placement": [0, 0]}))
    assert "the gpipe schedule runs one stage per rank" in run(setup, capsys, plan=looped)
    zero_bubble = setup["root"] / "zbv.json"
    plan = json.loads(setup["plan"].read_text())
    zero_bubble.write_text(json.dumps({**plan, "placement": [0, 0],
                                       "settings": {**plan["settings"], "schedule": "zbvzerobubble",
                                                    "virtual_stages": 2}}))
    assert "zbvzerobubble does" in run(setup, capsys, plan=zero_bubble, data_parallel="2")


def test_the_command_trains_and_a_failing_rank_is_one_line(setup: dict[str, Path],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The whole command under torchrun; then a resume whose stage-1 state is damaged: rank 1 fails, exit 2."""
    out = setup["root"] / "run"
    base = ["--plan", str(setup["plan"]), "--data", str(setup["data"]), "--save", str(out)]
    assert main([*base, "--checkpoint", str(setup["checkpoint"]), "--steps", "1", "--decay-steps", "2",
                 "--log-every", "1"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("train-model: plan, checkpoint and data checked; starting 2 of 2 ranks"), printed
    assert printed[1].startswith("loaded stage 0's ") and printed[2].startswith("step 1/1: loss "), printed
    assert printed[3].startswith(f"saved step 1 to {out} in "), printed
    (out / "train_state" / "stage-1.pt").write_bytes(b"damaged")
    before = {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()}
    code = main([*base, "--resume", str(out), "--steps", "2", "--decay-steps", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "train-model (rank 1): error: cannot read" in err and "stage-1.pt" in err, err
    assert {path.name: path.read_bytes() for path in out.iterdir() if path.is_file()} == before  # intact


def _rank_pids(plan: Path) -> dict[int, int]:
    """RANK -> pid of train-model's rank processes for ``plan`` (torchrun's children)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"partitioning.train.rank" in command and str(plan).encode() in command:
            rank = [v for v in environ if v.startswith(b"RANK=")]
            if rank and b"torch.distributed.run" not in command:
                found[int(rank[0][5:])] = int(entry.name)
    return found


def test_a_rank_killed_mid_run_is_one_line_and_the_last_save_resumes(setup: dict[str, Path]) -> None:
    """SIGKILL of rank 1 while it trains (saving every step): exit 2, one line naming the rank, and the checkpoint
    the run last committed is whole: it resumes for one more step."""
    out = setup["root"] / "killed"
    base = ["--plan", str(setup["plan"]), "--data", str(setup["data"]), "--save", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-m", "partitioning.train", *base, "--checkpoint",
                              str(setup["checkpoint"]), "--steps", "100000", "--save-every", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline, ranks = time.monotonic() + 240, dict[int, int]()
    while time.monotonic() < deadline and child.poll() is None and not ((out / "config.json").is_file() and
                                                                         len(ranks) == 2):
        time.sleep(0.3)
        ranks = _rank_pids(setup["plan"])
    assert len(ranks) == 2 and (out / "config.json").is_file(), child.communicate()
    os.kill(ranks[1], signal.SIGKILL)
    _, err = child.communicate(timeout=300)
    assert child.returncode == 2 and err.count("\n") == 1, err
    assert err.startswith("train-model: error: ") and "rank 1" in err, err
    saved = json.loads((out / "train_state.json").read_text())["step"]
    assert saved >= 1
    assert main([*base, "--resume", str(out), "--steps", str(saved + 1), "--decay-steps", "100000"]) == 0
    assert json.loads((out / "train_state.json").read_text())["step"] == saved + 1


def _files(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file() and not is_temporary(path.name)}


def _staged(directory: Path) -> bool:
    return any(is_temporary(path.name) and path.name.endswith(".tmp") for path in directory.rglob("*"))


def _catch_a_save(out: Path, lock: int, deadline: float) -> dict[str, bytes]:
    """Take the save directory's commit lock (what another writer committing there holds, common.write_guard)
    once a save has staged files: the save then waits before its commit, with every committed file the previous
    checkpoint's, until the lock is let go.  Taken between two saves instead, the next save waits at its start
    (nothing staged): let go and try again."""
    while time.monotonic() < deadline:
        while not _staged(out) and time.monotonic() < deadline:
            time.sleep(0.002)
        fcntl.flock(lock, fcntl.LOCK_EX)  # a commit under way finishes first
        if _staged(out):  # staged, not committed: no commit can start while the lock is held
            return _files(out)
        fcntl.flock(lock, fcntl.LOCK_UN)
        time.sleep(0.05)  # the next save starts, then waits at the lock
    raise AssertionError("no save was caught in time")


def test_ctrl_c_during_a_save_is_one_line_and_the_previous_save_stays_whole(setup: dict[str, Path]) -> None:
    """Ctrl-C (SIGINT to train-model's process group) while the ranks write a save, a previous save committed:
    exit 2, one line, the previous checkpoint byte for byte, no staged file left, and it loads and resumes."""
    out = setup["root"] / "interrupted"
    base = ["--plan", str(setup["plan"]), "--data", str(setup["data"]), "--save", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-m", "partitioning.train", *base, "--checkpoint",
                              str(setup["checkpoint"]), "--steps", "100000", "--save-every", "1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and child.poll() is None and not (out / "train_state.json").is_file():
            time.sleep(0.1)
        assert (out / "train_state.json").is_file(), child.communicate()
        lock = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
        try:
            before = _catch_a_save(out, lock, deadline)
            os.killpg(child.pid, signal.SIGINT)
            while _rank_pids(setup["plan"]) and time.monotonic() < deadline:  # held until the ranks are gone
                time.sleep(0.05)
        finally:
            os.close(lock)
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:  # the test failed before its Ctrl-C: stop the run (it stops its ranks)
            os.killpg(child.pid, signal.SIGTERM)
            child.communicate(timeout=120)
    assert child.returncode == 2 and err == "train-model: interrupted\n", err
    assert _files(out) == before and not any(is_temporary(path.name) for path in out.rglob("*"))
    _, info = stock_class("t5").from_pretrained(out, output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
    saved = json.loads(before["train_state.json"])["step"]
    assert main([*base, "--resume", str(out), "--steps", str(saved + 1), "--decay-steps", "100000"]) == 0
