"""One rank of the train-model acceptance test (run under torchrun): several runs in one process group.

Each case is a train-model command line; the rank runs it with the rank's own code
(``partitioning.train.rank.train``), then writes which checkpoint keys it read, which keys its
stage holds, and whether every other stage's parameters stayed on ``meta``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from families.loading import source_key
from partitioning.train.rank import train
from partitioning.train.request import parse


def run_case(name: str, argv: list[str], out: Path) -> dict:
    """Train one case on this rank (the process group initialized); write and return its record."""
    stage = train(parse(argv), torch.device("cpu"))
    own = sorted({key for n, _ in [*stage.module.named_parameters(), *stage.module.named_buffers()]
                  if (key := source_key(stage.meta, stage.stateless(n), stage.checkpoint)) is not None})
    others_meta = all(p.device.type == "meta" for module in stage.run.others for p in module.parameters())
    record = {"case": name, "rank": stage.rank, "replica": stage.replica, "loaded": sorted(stage.loaded),
              "own": own, "others_meta": others_meta}
    (out / f"{name}.rank{dist.get_rank()}.json").write_text(json.dumps(record))
    return record


def main() -> int:
    out, cases = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        for name, argv in cases.items():
            run_case(name, argv, out)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
