"""Acceptance: in a fresh environment of the user's (tests/environment/user_venv.py), the three commands run
against its installed transformers with neither --version nor PYTHONPATH.

convert-model converts the installed release (the committed package, byte for byte); partition-model plans a
tiny tied Qwen3 saved there by stock ``save_pretrained``; train-model trains it on 2 gloo ranks under torchrun and
saves a directory stock ``from_pretrained`` loads with no missing or unexpected keys, its embedding still tied
to the LM head and trained.  Slow (a virtual environment and a torch install): one test.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import REPO
from support.suite_release import user_environment
from user_venv import build, newest_verified, run

from families.layout import version_dir

CONFIG = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=32, tie_word_embeddings=True)
SAVE = f"""
import sys, torch, transformers
torch.manual_seed(0)
transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{CONFIG!r})).save_pretrained(sys.argv[1])
"""
LOAD = """
import json, sys, torch, transformers
start = transformers.Qwen3ForCausalLM.from_pretrained(sys.argv[1])
model, info = transformers.Qwen3ForCausalLM.from_pretrained(sys.argv[2], output_loading_info=True)
print(json.dumps({"version": transformers.__version__, "info": {k: sorted(map(str, v)) for k, v in info.items()},
                  "tied": model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(),
                  "trained": not torch.equal(start.model.embed_tokens.weight, model.model.embed_tokens.weight)}))
"""


def write_data(path: Path, count: int = 8) -> None:
    rng = random.Random(0)
    with path.open("w") as out:
        for _ in range(count):
            ids = [rng.randrange(CONFIG["vocab_size"]) for _ in range(rng.randint(3, 8))]
            out.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")


@pytest.mark.integration  # the registry's transformers wheel (torch from the local wheels)
def test_the_three_commands_run_against_the_installed_release(tmp_path: Path) -> None:
    release = newest_verified()
    bin_dir = build(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = {**user_environment(), "CONVERT_MODEL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}

    run([bin_dir / "convert-model", "qwen3", "--output-dir", "out"], work, env)
    committed = REPO / "generated_models" / "qwen3" / version_dir(release)
    written = work / "out" / "qwen3" / version_dir(release)
    assert sorted(p.name for p in written.iterdir()) == sorted(p.name for p in committed.glob("*.py"))
    for path in committed.glob("*.py"):
        assert (written / path.name).read_bytes() == path.read_bytes(), path.name

    run([bin_dir / "python", "-c", SAVE, "checkpoint"], work, env)
    run([bin_dir / "partition-model", "qwen3", "--config", "checkpoint/config.json", "--stages", "2", "--batch", "2",
         "--seq-len", "sequence=8", "--micro-batches", "2", "--output", "plan.json"], work, env)
    plan = json.loads((work / "plan.json").read_text())
    assert (plan["model"]["version"], plan["model"]["class"]) == (release, "Qwen3ForCausalLM")
    assert "models_dir" not in plan["model"]  # the committed package, as installed

    write_data(work / "train.jsonl")
    run([bin_dir / "train-model", "--plan", "plan.json", "--checkpoint", "checkpoint", "--data", "train.jsonl",
         "--steps", "2", "--lr", "0.01", "--save", "saved"], work, env)
    loaded = json.loads(run([bin_dir / "python", "-c", LOAD, "checkpoint", "saved"], work, env).splitlines()[-1])
    assert loaded["version"] == release
    assert loaded["info"]["missing_keys"] == [] and loaded["info"]["unexpected_keys"] == [], loaded["info"]
    assert loaded["tied"] and loaded["trained"], loaded
