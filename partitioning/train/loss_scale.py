"""fp16's loss scale over the ranks of a pipeline: torch's ``ShardedGradScaler``, an overflow on any rank skipping
every rank's step.

fp16 gradients below 2**-24 flush to zero, so fp16 training scales the loss: the backward starts from
``loss * S``, the gradients are unscaled (times ``1/S``) before clipping, and a step whose gradients hold inf or
NaN (``S`` was too large) is skipped while ``S`` halves; after ``growth_interval`` clean steps it doubles.  That
is torch's ``GradScaler``, what HF Trainer runs under ``fp16=True`` (through accelerate), and Trainer then also
skips the learning-rate schedule's step (``optimizer_step_was_skipped``), as here.

A pipeline's rank holds its stage's gradients only, so an overflow found on one rank must skip the step on
every rank, and every rank must keep the same ``S``: FSDP's ``ShardedGradScaler`` does exactly that (its
``unscale_`` sums the found-inf flags over the process group; each rank then updates ``S`` alike).  Only the
last stage scales a loss; every rank's scale is made at the start, for its ``unscale_``.

    before: loss.backward(); clip(); optimizer.step(); scheduler.step()
    after:  scaler.scale(loss).backward(); scaler.unscale_(optimizer); clip();
            scaler.step(optimizer); scaler.update(); scheduler.step() unless the step was skipped
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from partitioning.train.optim import PiecewiseAdamW

INITIAL = 2.0**16  # torch's GradScaler's init_scale


class LossScale:
    """One rank's share of the run's loss scale."""

    def __init__(self, device: torch.device, initial: float = INITIAL) -> None:
        self.scaler = ShardedGradScaler(device=device.type, init_scale=initial, process_group=dist.group.WORLD)
        self.scaler.scale(torch.ones((), device=device))  # the scale made on every rank, not only where a loss is

    @property
    def value(self) -> float:
        """The scale the next step's backward starts from."""
        return float(self.scaler.get_scale())

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def unscale(self, optimizer: PiecewiseAdamW) -> None:
        """The gradients divided by the scale, and whether any rank's overflowed found (a collective).  Seen
        through the optimizer's gradient views: a large parameter's pieces are what AdamW steps."""
        with optimizer.gradient_views():
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, scheduler: Any) -> bool:
        """The optimizer's and the schedule's step unless the gradients overflowed; whether they stepped."""
        before = self.value
        self.scaler.step(optimizer)
        self.scaler.update()
        taken = self.value >= before  # the scale halves exactly when the step was skipped (accelerate's test)
        if taken:
            scheduler.step()
        return taken

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scaler.load_state_dict(state)
