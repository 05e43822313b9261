"""What a run reports per logged step: ``metrics.jsonl`` in the save directory, TensorBoard scalars when asked.

One JSON object per line, written by the rank that holds the losses (the last stage of the first replica)
and flushed at once, so that a killed run keeps every step it logged::

    {"step": 3, "loss": 2.71, "lr": 4.9e-05, "grad_norm": 1.3, "tokens_per_s": 5120.0, "seconds": 0.41,
     "peak_memory_bytes": [812000000, 790000000], "memory": "process peak RSS"}

``eval_loss`` and ``eval_examples`` join the record of a step after which the run evaluated
(``--eval-data``: partitioning/train/evaluate.py), TensorBoard's ``eval/loss``.
``grad_norm`` is the global norm before clipping (present with ``--clip-grad``, which computes it);
``peak_memory_bytes`` holds one entry per stage of the pipeline (CUDA's peak allocated bytes on a GPU, the
process's peak resident set on CPU).  A resumed run's file starts with the history of the run it continues
(its lines up to the step resumed from), so each checkpoint's file tells its whole run, once per step.
``--tensorboard DIR`` writes the same numbers as ``train/<name>`` scalars with torch's ``SummaryWriter``
(the ``tensorboard`` package, which train-model checks before it starts the ranks), purging what a resumed run's later steps had written.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path
from typing import IO, Any

import torch

from common.atomic import write_atomic
from partitioning.train.layout import METRICS


def peak_memory(device: torch.device) -> tuple[int, str]:
    """This rank's peak memory so far, in bytes, and what was measured."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "CUDA peak allocated"
    kilobytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return kilobytes if sys.platform == "darwin" else kilobytes * 1024, "process peak RSS"


def history(directory: Path, upto: int) -> list[str]:
    """The lines of ``directory``'s metrics file up to step ``upto`` (a resumed run's past), in order."""
    path = directory / METRICS
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            step = json.loads(line).get("step")
        except (json.JSONDecodeError, AttributeError):
            continue  # a line a killed run left half-written
        if isinstance(step, int) and step <= upto:
            kept.append(line)
    return kept


class MetricsLog:
    """The per-step records of one run: appended to ``save/metrics.jsonl`` (when saving) and TensorBoard."""

    def __init__(self, save: Path | None, tensorboard: Path | None, resumed: Path | None, start: int) -> None:
        self._file: IO[str] | None = None
        self._writer: Any = None
        if save is not None:
            past = history(resumed, start) if resumed is not None else []
            save.mkdir(parents=True, exist_ok=True)
            write_atomic(save / METRICS, "".join(line + "\n" for line in past).encode())
            self._file = (save / METRICS).open("a", encoding="utf-8")
        if tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter  # the optional tensorboard package, checked before

            self._writer = SummaryWriter(str(tensorboard), purge_step=start + 1 if start else None)

    def log(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if self._writer is not None:
            for name, value in record.items():
                if name.startswith("eval_") and isinstance(value, (int, float)):
                    self._writer.add_scalar(f"eval/{name.removeprefix('eval_')}", value, record["step"])
                elif name != "step" and isinstance(value, (int, float)):
                    self._writer.add_scalar(f"train/{name}", value, record["step"])
                elif name == "peak_memory_bytes":
                    for stage, used in enumerate(value):
                        self._writer.add_scalar(f"train/peak_memory_bytes/stage_{stage}", used, record["step"])
            self._writer.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._writer is not None:
            self._writer.close()
