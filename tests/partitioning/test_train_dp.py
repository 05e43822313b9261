"""Data parallel x pipeline: 2 stages x 2 replicas (4 gloo ranks, one thread each) equal one process on the batch.

T5 (its embedding tied across both stages), GPipe.  The step's batch is split between the replicas, each a
pipeline of 2 micro-batches or 1; DDP averages each stage's gradients over its replicas, the tied embedding's
copies are summed over every replica's holders in the order of one process.

* 1 micro-batch per replica: bit for bit (DDP's average of two gradients, each over one micro-batch, is
  exactly one process's sum of the two, halved).
* 2 micro-batches per replica: one process accumulates ((g1 + g2) + g3) + g4, DDP adds (g1 + g2) + (g3 + g4)
  (its all-reduce over the replicas): equal up to that float summation order, the bound tested.  (The tied
  embedding's copies are summed in one process's order, but from step 2 on they see the other weights'
  differences.)
* Two torchrun "nodes" on this machine (rendezvous on 127.0.0.1, through the train-model command) give what
  one machine gives, bit for bit; without --node-rank train-model prints each node's command.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from support import REPO
from test_train_model import (
    OPTIONS,
    STEPS,
    assert_stage_only,
    launch,
    reference,
    save_checkpoint,
    saved_differences,
    stock_class,
    write_data,
    write_plan,
)

REPLICAS = 2
BOUND = 1e-5  # measured: at most 2.4e-7 after 3 AdamW steps at lr 0.01 (float32 rounding, carried by Adam)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def train_model(*argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]]), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "partitioning.train", *argv], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_two_replicas_of_two_stages_equal_one_process(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    cfg = save_checkpoint("t5", checkpoint)
    plan, data = tmp_path / "plan.json", tmp_path / "data.jsonl"
    write_plan("t5", cfg, "encoder.block.1", "gpipe", plan)
    write_data(data, plan, count=11)
    common = ["--plan", str(plan), "--checkpoint", str(checkpoint), "--data", str(data), "--steps", str(STEPS),
              "--data-parallel", str(REPLICAS), *OPTIONS]
    cases = {"exact": [*common, "--micro-batches", "1", "--save", str(tmp_path / "exact")],
             "bounded": [*common, "--save", str(tmp_path / "bounded")]}
    records = launch(REPLICAS * 2, cases, tmp_path / "records")
    assert sorted((r["replica"], r["rank"]) for r in records["exact"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert_stage_only(records["exact"])

    assert saved_differences("t5", tmp_path / "exact", reference("t5", checkpoint, plan, data, STEPS, 2)) == {}
    different = saved_differences("t5", tmp_path / "bounded", reference("t5", checkpoint, plan, data, STEPS, 4))
    assert different, "2 micro-batches per replica: DDP's summation order should show in the last bits"
    assert max(different.values()) < BOUND, different

    # The same run as two machines of 2 ranks each (replica d on node d), through the command.
    port = free_port()
    nodes = [train_model(*cases["bounded"][:-1], str(tmp_path / "nodes"), "--nnodes", "2", "--node-rank",
                         str(node), "--rdzv-endpoint", f"127.0.0.1:{port}") for node in range(2)]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert f"step {STEPS}/{STEPS}: loss" in outputs[0]
    one_machine = stock_class("t5").from_pretrained(tmp_path / "bounded")
    assert saved_differences("t5", tmp_path / "nodes", one_machine) == {}  # bit for bit

    printed = subprocess.run([sys.executable, "-m", "partitioning.train", *cases["bounded"], "--nnodes", "2"],
                             cwd=REPO, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]])}, capture_output=True, text=True)
    lines = printed.stdout.splitlines()
    assert printed.returncode == 0 and len(lines) == 2, printed.stderr
    assert all(f"--node-rank={node}" in line and "--nproc-per-node=2" in line and "--data-parallel 2" in line
               for node, line in enumerate(lines)), lines
