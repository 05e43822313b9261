"""The optimizer and learning-rate schedule of a run: torch's AdamW and LambdaLR, as a user would set them up.

Weight decay spares what HF Trainer's does (``Trainer.get_decay_parameter_names``, transformers 5.x): every
parameter inside an ``nn.LayerNorm`` and every one whose name, lowercased, matches :data:`NO_DECAY_PATTERNS`
(biases, norm weights) is in a second AdamW group of weight decay 0; ``decay_all`` keeps one group.

The schedules are transformers' ``get_{linear,cosine,constant}_schedule_with_warmup``
written out (linear warm-up over ``warmup`` steps, then linear or half-cosine
decay to 0 at ``total`` steps, or constant), so that a run here and a loop of
one's own with those functions follow the same learning rates.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

DECAYS = ("linear", "cosine", "constant")
# HF Trainer's (5.x) names of the parameters weight decay leaves alone, searched in the lowercased stock name.
NO_DECAY_PATTERNS = tuple(re.compile(pattern) for pattern in
                          (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"))


@dataclass(frozen=True)
class OptimizerSettings:
    lr: float = 5e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup: int = 0
    decay: str = "linear"
    total: int = 1  # the steps the schedule decays over (the run's --steps)
    decay_all: bool = False  # weight decay on every parameter (one group), not as HF Trainer


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

    def __init__(self, parameters: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]], piece: int = PIECE,
                 **options: Any) -> None:
        self.pieces: list[tuple[torch.nn.Parameter, list[torch.Tensor]]] = []
        given: list[Any] = list(parameters)
        groups: list[dict[str, Any]] = given if given and isinstance(given[0], dict) else [{"params": given}]
        super().__init__([{**group, "params": self._tensors(group["params"], piece)} for group in groups], **options)

    def _tensors(self, parameters: Iterable[torch.nn.Parameter], piece: int) -> list[torch.Tensor]:
        """What AdamW steps for ``parameters``: each, or the views of one larger than ``piece``."""
        tensors: list[torch.Tensor] = []
        for parameter in parameters:
            if parameter.numel() > piece and parameter.is_contiguous():
                views = list(parameter.detach().view(-1).split(piece))
                self.pieces.append((parameter, views))
                tensors += views
            else:
                tensors.append(parameter)
        return tensors

    @contextlib.contextmanager
    def gradient_views(self) -> Iterator[None]:
        """Each piece's ``grad`` a view of its parameter's gradient, while inside: what AdamW steps, and what
        anything reading the optimizer's gradients (a GradScaler's unscale) sees."""
        for parameter, views in self.pieces:
            grads = parameter.grad.reshape(-1).split(views[0].numel()) if parameter.grad is not None else None
            for index, view in enumerate(views):
                view.grad = grads[index] if grads is not None else None
        try:
            yield
        finally:
            for _, views in self.pieces:
                for view in views:
                    view.grad = None

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        with self.gradient_views():
            return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for parameter, _ in self.pieces:
            if set_to_none:
                parameter.grad = None
            elif parameter.grad is not None:
                parameter.grad.zero_()


def exempt_from_decay(model: torch.nn.Module, stock_name: Callable[[str], str]) -> set[str]:
    """The stock names (``stock_name`` of each of ``model``'s own) of the parameters HF Trainer gives no weight
    decay: inside an ``nn.LayerNorm``, or named to match :data:`NO_DECAY_PATTERNS`.  ``model`` is a whole model
    (a stage's graph has lost the modules; its rank asks of the model it was split from).  A pattern found in
    the name relative to any module above the parameter (as Trainer searches) is found in the whole name: each
    starts at a dot of it."""
    inside = {f"{prefix}.{name}" for prefix, child in model.named_modules() if prefix
              and isinstance(child, torch.nn.LayerNorm) for name, _ in child.named_parameters()}
    return {stock_name(name) for name, _ in model.named_parameters()
            if name in inside or any(pattern.search(stock_name(name).lower()) for pattern in NO_DECAY_PATTERNS)}


def make_optimizer(named: Iterable[tuple[str, torch.nn.Parameter]], exempt: set[str], settings: OptimizerSettings
                   ) -> tuple[PiecewiseAdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``named`` (in order) and its schedule: the ``exempt`` names in a group of weight decay 0 after the
    others' (both groups always, so that a save's state fits any stage of the same plan), or one group with
    ``settings.decay_all``."""
    parameters = list(named)
    groups: list[dict[str, Any]] = [{"params": [p for _, p in parameters]}] if settings.decay_all else [
        {"params": [p for name, p in parameters if name not in exempt]},
        {"params": [p for name, p in parameters if name in exempt], "weight_decay": 0.0}]
    optimizer = PiecewiseAdamW(groups, lr=settings.lr, betas=settings.betas, eps=settings.eps,
                               weight_decay=settings.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(settings.warmup, settings.total,
                                                                       settings.decay))
    return optimizer, scheduler
