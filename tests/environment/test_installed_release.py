"""The installed transformers is the default (families/installed.py), and a command asked for another release
says so in one line with the exact way to get it.

The default-environment case runs partition-model as a user's shell does (no PYTHONPATH: the venv's own
release, whatever it is); the other-release case plans Qwen3 at 5.23.0 (its side-by-side install first on
PYTHONPATH) and hands the plan to train-model in this process, whose transformers is the suite's 4.5.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from support.suite_release import SUITE_RELEASE, user_environment

from families.installed import SIDE_BY_SIDE, release
from partitioning.train.cli import main as train_main

OTHER = "5.23.0"


def test_the_release_is_read_as_import_finds_it_without_importing_it() -> None:
    found, where = release("transformers")
    assert found == SUITE_RELEASE and Path(where).is_relative_to(SIDE_BY_SIDE / SUITE_RELEASE)
    probe = ("import sys; from families.installed import release; print(release('transformers')[0]); "
             "print('transformers' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SIDE_BY_SIDE / OTHER), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [OTHER, "False"]


def test_partition_model_plans_the_installed_release_by_default(tmp_path: Path) -> None:
    env = user_environment()
    version = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    done = subprocess.run([sys.executable, "-m", "partitioning", "t5", "--stages", "2", "--shape", "tiny", "--output",
                           str(tmp_path / "plan.json")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "plan.json").read_text())["model"]["version"] == version


def test_train_model_on_a_plan_of_another_release_names_both_and_the_way(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Was: ``transformers has no class Qwen3Config``, with no hint."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SIDE_BY_SIDE / OTHER), str(REPO)])}
    planned = subprocess.run([sys.executable, "-m", "partitioning", "qwen3", "--stages", "2", "--shape", "tiny",
                              "--batch", "2", "--seq-len", "sequence=8", "--output", str(tmp_path / "plan.json")],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert planned.returncode == 0, planned.stderr[-2000:]
    (tmp_path / "train.jsonl").write_text(json.dumps({"input_ids": [1, 2], "labels": [1, 2]}) + "\n")
    assert train_main(["--plan", str(tmp_path / "plan.json"), "--checkpoint", str(tmp_path), "--data",
                       str(tmp_path / "train.jsonl"), "--steps", "1"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"train-model: error: generated_models.qwen3.v5_23_0 (generated from transformers {OTHER})"
                           f" needs transformers {OTHER}, but the one that imports here is transformers "
                           f"{SUITE_RELEASE} (")
    assert line.endswith(f"(hint: PYTHONPATH={SIDE_BY_SIDE / OTHER} before the command runs it with transformers "
                         f"{OTHER})")
