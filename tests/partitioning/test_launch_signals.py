"""A signal to one process of a train-model run: the report names where it went, and no rank trains on.

SIGTERM to rank 0 alone was reported as rank 1's "internal error: RuntimeError: [...gloo...] Read error"; a
SIGKILL of the launcher alone left torchrun and its ranks training (torchrun runs in its own session).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import REPO
from test_train_hostile import _rank_pids
from test_train_model import save_checkpoint, write_data, write_plan


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("signals")
    cfg = save_checkpoint("t5", root / "t5")
    write_plan("t5", cfg, "encoder.block.1", "gpipe", root / "plan.json")
    write_data(root / "data.jsonl", root / "plan.json")
    return {"root": root, "checkpoint": root / "t5", "plan": root / "plan.json", "data": root / "data.jsonl"}


def start(setup: dict[str, Path], name: str, save: bool) -> tuple[subprocess.Popen[str], dict[int, int], Path]:
    """train-model for ever under a plan of its own (the ranks are found by it), printing nothing (a rank printing
    to a dead launcher's pipe would fail on it); ``save``: every step, and returned once one step is saved, else
    once both ranks have run a while.  Its ranks' pids, and the plan."""
    plan, out = setup["root"] / f"{name}.json", setup["root"] / name
    plan.write_bytes(setup["plan"].read_bytes())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    saving = ["--save", str(out), "--save-every", "1"] if save else []
    child = subprocess.Popen([sys.executable, "-m", "partitioning.train", "--plan", str(plan), "--data",
                              str(setup["data"]), "--checkpoint", str(setup["checkpoint"]), "--steps", "100000",
                              "--log-every", "100000", *saving],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline, ranks = time.monotonic() + 240, dict[int, int]()
    while time.monotonic() < deadline and child.poll() is None and not (
            len(ranks) == 2 and (not save or (out / "train_state.json").is_file())):
        time.sleep(0.3)
        ranks = _rank_pids(plan)
    assert len(ranks) == 2 and (not save or (out / "train_state.json").is_file()), child.communicate()
    if not save:
        time.sleep(20)  # loading, tracing, training: the ranks are under way
    return child, ranks, plan


def test_sigterm_to_rank_0_alone_is_reported_as_such(setup: dict[str, Path]) -> None:
    child, ranks, _ = start(setup, "sigterm", save=True)
    try:
        os.kill(ranks[0], signal.SIGTERM)
        _, err = child.communicate(timeout=300)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 2 and err.count("\n") == 1, err
    assert err.startswith("train-model: error: ") and "rank 0 was killed by signal 15 (SIGTERM)" in err, err


def test_the_ranks_stop_when_the_launcher_is_killed_alone(setup: dict[str, Path]) -> None:
    child, _, plan = start(setup, "sigkill", save=False)
    child.kill()  # SIGKILL to train-model alone: torchrun and the ranks are in a session of their own
    child.communicate()
    deadline = time.monotonic() + 60
    while _rank_pids(plan) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _rank_pids(plan)
    for pid in left.values():  # the test's own cleanup where the run failed it
        os.kill(pid, signal.SIGKILL)
    assert not left, f"ranks still running a minute after the launcher died: {left}"
