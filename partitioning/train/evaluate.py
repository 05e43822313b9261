"""Evaluation during training: the mean loss over an eval file, forward only through the pipeline, in eval mode.

The file's examples are taken in order, in micro-batches of the plan's size: micro-batch ``g`` holds examples
``g*B .. (g+1)*B - 1``.  A round is one micro-batch per micro-batch slot of every replica (replica ``d`` the
``d``-th share, as in training), so rounds cover the file in order; the last round is filled up with copies of
the first example whose every label is ignored, which add nothing to a loss.  Each micro-batch's loss is
stock's (the mean over its labelled tokens or examples); the eval loss is their mean weighted by the examples
each holds (micro-batches of padding alone left out), as HF Trainer weighs its batches::

    eval_loss = sum(loss_g * n_g) / sum(n_g)

Nothing a training step reads changes: no gradient, no optimizer state, no random draw (eval_mode.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from partitioning.train.data import IGNORED, Dataset, is_label
from partitioning.train.stage import StageModel


def rounds(dataset: Dataset, per_round: int) -> list[dict[str, torch.Tensor]]:
    """The batches of the eval rounds (every replica's share together), the last one padded."""
    count = dataset.count
    found = []
    for start in range(0, count, per_round):
        chosen = torch.arange(start, min(start + per_round, count))
        batch = {name: tensor[chosen] for name, tensor in dataset.tensors.items()}
        missing = per_round - len(chosen)
        if missing:
            filler = {name: tensor[:1].expand(missing, *tensor.shape[1:]).clone()
                      for name, tensor in dataset.tensors.items()}
            for name in filler:
                if is_label(name):
                    filler[name].fill_(IGNORED)
            batch = {name: torch.cat([batch[name], filler[name]]) for name in batch}
        found.append(batch)
    return found


def micro_batch_counts(count: int, micro: int, micro_batches: int, replicas: int, replica: int,
                       round_index: int) -> list[tuple[int, int]]:
    """``(global index, real examples)`` of each of ``replica``'s micro-batches in round ``round_index``."""
    first = (round_index * replicas + replica) * micro_batches
    return [(g, max(0, min(micro, count - g * micro))) for g in range(first, first + micro_batches)]


def round_count(count: int, micro: int, micro_batches: int, replicas: int) -> int:
    return math.ceil(count / (micro * micro_batches * replicas))


def evaluate(stage: StageModel, batches: list[dict[str, torch.Tensor]] | None, count: int) -> float | None:
    """The eval loss (on the rank that reports: the first replica's last stage; None elsewhere).  Every rank of
    the run takes part; ``batches`` is what :func:`rounds` made, on each replica's first stage."""
    micro = stage.micro_batch.batch
    found: list[tuple[int, int, float]] = []
    for index in range(round_count(count, micro, stage.micro_batches, stage.replicas)):
        batch = stage.shard(batches[index]) if batches is not None else None
        losses = stage.evaluate(batch)
        if stage.run.last:
            counts = micro_batch_counts(count, micro, stage.micro_batches, stage.replicas, stage.replica, index)
            found += [(g, n, loss.item()) for (g, n), loss in zip(counts, losses) if n]
    if not stage.run.last:
        return None
    if stage.replicas > 1:  # every replica's micro-batches, in the file's order
        everyone: list[Any] = [None] * stage.replicas
        dist.all_gather_object(everyone, found, group=stage.run.dp_group)
        found = sorted(entry for part in everyone for entry in part)
    if stage.replica != 0:
        return None
    return sum(loss * n for _, n, loss in found) / sum(n for _, n, _ in found)
