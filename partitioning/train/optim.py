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
from typing import Any

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


PIECE = 1 << 22  # elements (16 MB of fp32); a multiple of every SIMD width, so each piece starts aligned


class PiecewiseAdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` that steps each parameter of more than ``piece`` elements as views of ``piece``
    elements (of the parameter and of its gradient).

    AdamW is elementwise: a view gets the same arithmetic as the whole, bit for bit, while the temporaries
    torch's single-tensor AdamW makes per tensor (``exp_avg_sq.sqrt()``, its division: two of the tensor's
    size) are a piece's, not a 206 MB tied embedding's (measured on the 4-stage run in
    docs/benchmarks.md).  The state dict holds one state per piece, in order.
    """

    def __init__(self, parameters: Iterable[torch.nn.Parameter], piece: int = PIECE, **options: Any) -> None:
        self.pieces: list[tuple[torch.nn.Parameter, list[torch.Tensor]]] = []
        tensors: list[torch.Tensor] = []
        for parameter in parameters:
            if parameter.numel() > piece and parameter.is_contiguous():
                views = list(parameter.detach().view(-1).split(piece))
                self.pieces.append((parameter, views))
                tensors += views
            else:
                tensors.append(parameter)
        super().__init__(tensors, **options)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        for parameter, views in self.pieces:
            grads = parameter.grad.reshape(-1).split(views[0].numel()) if parameter.grad is not None else None
            for index, view in enumerate(views):
                view.grad = grads[index] if grads is not None else None
        try:
            return super().step(closure)
        finally:
            for _, views in self.pieces:
                for view in views:
                    view.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for parameter, _ in self.pieces:
            if set_to_none:
                parameter.grad = None
            elif parameter.grad is not None:
                parameter.grad.zero_()


def make_optimizer(parameters: Iterable[torch.nn.Parameter], settings: OptimizerSettings
                   ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    optimizer = PiecewiseAdamW(parameters, lr=settings.lr, betas=settings.betas, eps=settings.eps,
                               weight_decay=settings.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(settings.warmup, settings.total,
                                                                       settings.decay))
    return optimizer, scheduler
