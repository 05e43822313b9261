"""Pipelined LLM training equals one process (torchrun, 2 gloo ranks, GPipe and 1F1B): the 5.23.0 Llama.

One launch of pipelining_worker.py with the release's transformers first on PYTHONPATH (as the release
workers run) trains tiny Llama configs both ways, 3 Adam steps: tied embeddings (the head's copy on the last
rank) cut between the two layers, and untied at the optimal split. Per-micro-batch losses, every gradient
and every weight after the steps torch.equal to the single process; every replica of the tied weight the
same; the stages replay the causal mask and the rotary cos/sin their plan names instead of receiving them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import load_script
from support import REPO, SUPPORT, TORCHRUN

RELEASE = "5.23.0"
CASES = {  # case -> (stages holding the tied weight, stages that recompute the mask and the rotary embedding)
    "tied:gpipe:2:model.layers.1": ({"shared_embed_weight": [0, 1]}, [1]),
    "untied:1f1b:4:optimal": ({}, [1]),
}
installer = load_script("install_releases")


def test_pipelined_llama_equals_one_process(tmp_path: Path) -> None:
    listed = {r.version: r for r in installer.read_releases()}
    assert installer.is_installed(listed[RELEASE]), f"no stock install of transformers {RELEASE}: bash scripts/setup.sh"
    path = [str(installer.install_dir(RELEASE)), str(REPO), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node=2", str(SUPPORT / "pipelining_worker.py"),
                             "--out", str(tmp_path), "--family", f"llama@{RELEASE}", *CASES], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    records: dict[str, list[dict]] = {}
    for file in sorted(tmp_path.glob("*.json")):
        record = json.loads(file.read_text())
        records.setdefault(record["case"], []).append(record)
    assert sorted(records) == sorted(CASES) and all(len(ranks) == 2 for ranks in records.values())
    for case, ranks in records.items():
        tied, replaying = CASES[case]
        for record in ranks:
            assert record["problems"] == [], f"{case} rank {record['rank']}: {record['problems'][:5]}"
            for chunk, keys in record["replayed"].items():  # one chunk per rank: chunk = rank
                assert keys == record["planned"][chunk], case  # the backend does what the plan says
                modules = sorted(key.split(":")[0] for key in keys)
                assert modules == (["model", "model.rotary_emb"] if int(chunk) in replaying else []), (case, modules)
        held: dict[str, list[int]] = {}
        for record in ranks:
            for name, chunks in record["tied"].items():
                held[name] = sorted(held.get(name, []) + chunks)
        assert held == tied, case
