"""The ordered tied-gradient sum (``partitioning.gpu.tied.ordered_sum``) on 3 gloo ranks, without a model.

One torchrun launch.  Each case's sum on every holder must be ``torch.equal`` to one process's order (per
micro-batch the uses from the last back, then the micro-batches), and not to the uses' forward order: the
made-up gradients span twelve orders of magnitude, so the case can tell the two apart.  The model-level
exactness (a tied T5 / GPT-2 trained by the pipeline equals one process) is in ``test_pipelining.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support import REPO, SUPPORT, TORCHRUN


def test_ordered_sum_relays_partial_sums_in_one_process_order(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node=3", str(SUPPORT / "tied_sum_worker.py"),
                             str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    records = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("*.json"))]
    assert sorted((r["case"], r["rank"]) for r in records) == [("ends", 0), ("ends", 2), *[("relay", r) for r in range(3)]]
    for record in records:
        assert record["equal"] and not record["forward_order_equal"], record
