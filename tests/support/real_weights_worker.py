"""One rank of test_real_weights.py's pipeline case (run under torchrun, 2 ranks): all-MiniLM-L6-v2 split by
the partitioner's own 2-stage plan, run forward by the pipelining backend's stages; the last rank saves the
last hidden state of the whole batch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import ScheduleGPipe

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package
from families.family import ModelFamily  # noqa: E402
from families.models import MicroBatch  # noqa: E402
from partitioning.cost.chain import family_chain
from partitioning.gpu.pipelining import PipelineRun  # noqa: E402
from partitioning.solve.partition import Settings, partition  # noqa: E402
from support import real_weights  # noqa: E402

MICRO_BATCHES = 2


def main() -> int:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    try:
        family = ModelFamily.load("bert", "4.5.1")
        config = real_weights.config()
        model = family.build("BertModel", config, device="cpu").eval()
        model.load_state_dict(real_weights.state_dict(), strict=True)
        batch = real_weights.tokenized()
        size, length = batch["input_ids"].shape
        chain = family_chain(family, "BertModel", config, MicroBatch(size // MICRO_BATCHES, {"sequence": length}))
        plan = partition(chain.blocks, 2, Settings(micro_batches=MICRO_BATCHES))
        example = {k: v[:size // MICRO_BATCHES] for k, v in batch.items()}
        run = PipelineRun(model, plan, example, micro_batches=MICRO_BATCHES, schedule="gpipe")
        # PipelineRun's own schedule trains (a loss, then backward); this one only runs the stages forward.
        forward = ScheduleGPipe(run.stage, MICRO_BATCHES)
        with torch.no_grad():
            args = tuple(batch[name] for name in run.input_names) if run.rank == 0 else ()
            output = forward.step(*args)
        if run.rank == 1:
            torch.save(output, out / "last_hidden_state.pt")
            record = {"stages": [stage.index for stage in plan.stages],
                      "blocks": [list(stage.blocks) for stage in plan.stages]}
            (out / "result.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
