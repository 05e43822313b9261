"""train-model on a CUDA device, NCCL process group: equal to the same steps in one process on that device.

CI has no GPU, so CI skips these; they are the device checks a session runs when it is lent a GPU
(docs/train-model.md, "On a GPU").  One GPU is enough: NCCL refuses two ranks on one device ("Duplicate GPU
detected", measured on an H200), so the plan puts two chunks on one rank (Interleaved1F1B), which still runs
the NCCL path: the process group, CUDA stages, the tied weight's copies on two chunks summed in order,
clipping, saving from CUDA.  torch before 2.13 cannot hand an integer input between two chunks of one rank
(its same-rank hand-over marks every tensor as requiring a gradient): there the plan is one stage.
The reference is the stock model on the same device, torch.optim.AdamW, transformers' warm-up schedule and
clip_grad_norm_ (support/train_runs.py); the saved directory is read back with stock from_pretrained.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import REPO
from support.model_families import FAMILIES
from support.train_runs import (
    OPTIONS,
    PER_MICRO_BATCH,
    STEPS,
    reference,
    save_checkpoint,
    saved_differences,
    write_data,
)

from partitioning.train.loss_scale import INITIAL

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device: run where a GPU is lent")
MICRO_BATCHES = 4
CHUNKS = 2 if tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 13) else 1
CONFIGS = {"t5": "2layer-gelu-tied", "gpt2": "3layer-tied-relu-inner", "bert": "1layer-tied",
           "roberta": "1layer-tied", "bart": "2layer-scaled-3dec"}  # tiny configs with a tied weight


def run(module: str, *arguments: object) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", module, *map(str, arguments)], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout


def train(name: str, tmp_path: Path, dtype: str) -> tuple[Path, Path, Path, Path]:
    family = FAMILIES[name]
    checkpoint, plan, data, saved = (tmp_path / part for part in ("checkpoint", "plan.json", "data.jsonl", "saved"))
    save_checkpoint(family, CONFIGS[name], checkpoint)
    lengths = [f"--seq-len={length}={size}" for length, size in family.train_lengths.items()]
    schedule = ["--schedule", "interleaved1f1b", "--virtual-stages", 2] if CHUNKS == 2 else ["--schedule", "1f1b"]
    run("partitioning.cli", name, "--version", "4.5.1", "--config", checkpoint / "config.json", "--stages", 1,
        *schedule, "--micro-batches", MICRO_BATCHES,
        "--batch", PER_MICRO_BATCH, *lengths, "--output", plan)
    write_data(data, plan, count=2 * MICRO_BATCHES * PER_MICRO_BATCH)
    out = run("partitioning.train", "--plan", plan, "--checkpoint", checkpoint, "--data", data, "--steps", STEPS,
              "--save", saved, "--dtype", dtype, "--verbose", *OPTIONS)
    assert f"step {STEPS}/{STEPS}: loss" in out, out
    # the metrics file reads the GPU's own allocator: a CPU figure (process RSS) here would mean the wrong device
    records = [json.loads(line) for line in (saved / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == list(range(1, STEPS + 1))
    assert {record["memory"] for record in records} == {"CUDA peak allocated"}
    assert all(used > 0 for record in records for used in record["peak_memory_bytes"])
    return checkpoint, plan, data, saved


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fp32_equals_one_process(name: str, tmp_path: Path) -> None:
    checkpoint, plan, data, saved = train(name, tmp_path, "fp32")
    expected = reference(FAMILIES[name], checkpoint, plan, data, STEPS, MICRO_BATCHES, device=torch.device("cuda"))
    assert saved_differences(FAMILIES[name], saved, expected) == {}


def test_bf16_autocast_equals_one_process(tmp_path: Path) -> None:
    checkpoint, plan, data, saved = train("gpt2", tmp_path, "bf16")
    expected = reference(FAMILIES["gpt2"], checkpoint, plan, data, STEPS, MICRO_BATCHES, bf16=True,
                         device=torch.device("cuda"))
    assert saved_differences(FAMILIES["gpt2"], saved, expected) == {}


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_fp16_loss_scaling_equals_one_process(name: str, tmp_path: Path) -> None:
    """fp16 autocast with the loss scale (FSDP's ShardedGradScaler over the NCCL group) against torch's GradScaler
    in one process on the same GPU."""
    checkpoint, plan, data, saved = train(name, tmp_path, "fp16")
    expected = reference(FAMILIES[name], checkpoint, plan, data, STEPS, MICRO_BATCHES, fp16_scale=INITIAL,
                         device=torch.device("cuda"))
    assert saved_differences(FAMILIES[name], saved, expected) == {}
