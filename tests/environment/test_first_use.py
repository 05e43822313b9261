"""An installed transformers release nothing commits converts into the user's cache on first use, checked
against that installed stock code, and partition-model and train-model run it from there.

transformers 5.22.0 (between verified releases, never committed) is installed into a scratch directory by
converter/installs.py with the pins of the era after it (5.23's: 5.22 needs huggingface_hub 1.x, which the
era before, 4.57's, predates) and is the release the commands import; nothing else is on their path but
this checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from support.suite_release import user_environment

from converter import installs
from families.installed import user_models
from families.layout import converted_in, generated_package, version_dir

RELEASE = "5.22.0"
SAVE = """
import sys, torch, transformers
torch.manual_seed(0)
config = transformers.Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=16)
transformers.Qwen3ForCausalLM(config).save_pretrained(sys.argv[1])
"""


def command(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL)


@pytest.mark.integration
def test_an_uncommitted_installed_release_is_converted_once_into_the_cache(tmp_path: Path) -> None:
    assert not (REPO / "generated_models" / "qwen3" / version_dir(RELEASE)).exists(), f"{RELEASE} is committed now"
    eras = {release.version: release for release in installs.releases_for(installs.verified_releases())}
    installs.install(installs.Release(RELEASE, eras["5.23.0"].requirements), tmp_path / "installs")
    cache = tmp_path / "cache"
    env = {**user_environment(), "CONVERT_MODEL_CACHE": str(cache), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "installs" / RELEASE), str(REPO)])}
    assert command(["-c", SAVE, "checkpoint"], tmp_path, env).returncode == 0

    plan_argv = ["-m", "partitioning", "qwen3", "--config", "checkpoint/config.json", "--stages", "2", "--batch",
                 "2", "--seq-len", "sequence=8", "--micro-batches", "2", "--output", "plan.json"]
    first = command(plan_argv, tmp_path, env)
    assert first.returncode == 0, first.stderr[-3000:]
    root = user_models(cache).resolve()
    assert f"qwen3 {RELEASE}: no committed package; converting the installed release into {root}" in first.stderr
    assert converted_in(root, "qwen3", RELEASE)
    plan = json.loads((tmp_path / "plan.json").read_text())["model"]
    assert (plan["version"], plan["models_dir"]) == (RELEASE, str(root))
    assert plan["module"] == generated_package("qwen3", RELEASE, root)

    written = {p: p.stat().st_mtime_ns for p in (root / "qwen3" / version_dir(RELEASE)).iterdir()}
    again = command(plan_argv, tmp_path, env)
    assert again.returncode == 0 and "converting" not in again.stderr, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in written} == written  # converted once, then imported from the cache

    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"input_ids": [1, 2, 3, 4, 5], "labels": [1, 2, 3, 4, 5]})
                                                  + "\n" for _ in range(4)))
    trained = command(["-m", "partitioning.train", "--plan", "plan.json", "--checkpoint", "checkpoint", "--data",
                       "train.jsonl", "--steps", "1", "--save", "saved"], tmp_path, env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert (tmp_path / "saved" / "config.json").is_file()
