"""The optimizer and learning-rate schedule of a run: torch's AdamW and LambdaLR, as a user would set them up.

The schedules are transformers' ``get_{linear,cosine,constant}_schedule_with_warmup``
written out (linear warm-up over ``warmup`` steps, then linear or half-cosine
decay to 0 at ``total`` steps, or constant), so that a run here and a loop of
one's own with those functions follow the same learning rates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

DECAYS = ("linear", "cosine", "constant")


@dataclass(frozen=True)
class OptimizerSettings:
    lr: float = 5e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup: int = 0
    decay: str = "linear"
    total: int = 1  # the steps the schedule decays over (the run's --steps)


def lr_lambda(warmup: int, total: int, decay: str) -> Callable[[int], float]:
    """The factor of the base learning rate at each step (LambdaLR's ``lr_lambda``)."""
    if decay not in DECAYS:
        raise ValueError(f"unknown decay {decay!r}; known: {', '.join(DECAYS)}")

    def factor(step: int) -> float:
        if step < warmup:
            return float(step) / float(max(1, warmup))
        if decay == "constant":
            return 1.0
        if decay == "linear":
            return max(0.0, float(total - step) / float(max(1, total - warmup)))
        progress = float(step - warmup) / float(max(1, total - warmup))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))

    return factor


def make_optimizer(parameters: Iterable[torch.nn.Parameter], settings: OptimizerSettings
                   ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, betas=settings.betas, eps=settings.eps,
                                  weight_decay=settings.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(settings.warmup, settings.total,
                                                                       settings.decay))
    return optimizer, scheduler
