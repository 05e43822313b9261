"""Tied weights across pipeline stages: which stages hold a copy, and the gradient every copy must get.

The engine gives each stage that uses a parameter its own copy and never
combines their gradients.  Each copy records, per micro-batch, the gradient
each of its uses sends back; the copies then exchange those and add them up
in one fixed order: micro-batch by micro-batch, from the last use back to
the first.  That is the order in which single-process autograd accumulates
a leaf used several times (the last use's gradient arrives first), so every
copy gets the single-process gradient bit for bit.  The price is keeping
uses x micro-batches gradients of the weight until the step ends.

With data parallelism the group holds every replica's copies, replica-major
(replica ``d`` runs micro-batches ``d*M .. d*M + M - 1`` of the step), and the
sum walks the replicas in order: the order of one process on the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves

from common.errors import UserError


@dataclass
class TiedCopy:
    """This rank's copy of a parameter that several stages hold, and what each of its uses sent back."""

    name: str
    stages: tuple[int, ...]
    parameter: nn.Parameter
    group: dist.ProcessGroup  # every holder of every replica, replica-major
    replicas: int = 1
    per_micro_batch: list[list[torch.Tensor | None]] = field(default_factory=list)  # [micro-batch][use]

    def watch(self, outputs: object) -> None:
        """Hook every use of the copy in the autograd graph of one micro-batch's forward."""
        if not torch.is_grad_enabled():
            return  # no backward follows a forward without autograd
        view = self.parameter.view_as(self.parameter).grad_fn
        assert view is not None, self.name  # a tied copy trains: its views have a grad_fn under grad mode
        accumulate = view.next_functions[0][0]
        uses: list[tuple[int, torch.autograd.graph.Node, int]] = []
        seen: set[torch.autograd.graph.Node] = set()
        pending: list[torch.autograd.graph.Node | None] = [t.grad_fn for t in tree_leaves(outputs) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while pending:
            node = pending.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            for index, (following, _) in enumerate(node.next_functions):
                if following is accumulate:
                    uses.append((node._sequence_nr(), node, index))
                pending.append(following)
        grads: list[torch.Tensor | None] = [None] * len(uses)
        for position, (_, node, index) in enumerate(sorted(uses, key=lambda use: use[0])):  # forward order
            node.register_hook(self._keep(grads, position, index))
        self.per_micro_batch.append(grads)

    @staticmethod
    def _keep(grads: list[torch.Tensor | None], position: int, index: int) -> Callable[..., None]:
        def keep(grad_inputs: tuple[torch.Tensor | None, ...], _: object) -> None:
            gradient = grad_inputs[index]
            grads[position] = None if gradient is None else gradient.detach().clone()
        return keep


def ordered_sum(copy: TiedCopy, micro_batches: int) -> torch.Tensor:
    """All holders' use gradients, summed per micro-batch from the last use back, then over micro-batches
    (replica by replica)."""
    if len(copy.per_micro_batch) != micro_batches:
        raise UserError(f"{copy.name}: {len(copy.per_micro_batch)} forwards in a step of {micro_batches} micro-batches")
    zero = torch.zeros_like(copy.parameter)
    device = zero.device  # collectives run where the weight lives (NCCL needs CUDA tensors)
    uses_here = len(copy.per_micro_batch[0])
    # [use, micro-batch, *weight]: a missing gradient (no use reached) is a zero flagged absent
    mine = torch.stack([torch.stack([g if g is not None else zero for g in uses]) if uses_here else zero[None][:0]
                        for uses in copy.per_micro_batch], dim=1)
    present = torch.tensor([[g is not None for g in uses] for uses in copy.per_micro_batch],
                           dtype=torch.uint8, device=device).reshape(micro_batches, uses_here).T
    copy.per_micro_batch.clear()
    members = len(copy.stages) * copy.replicas
    counts = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(members)]
    dist.all_gather(counts, torch.tensor([uses_here], device=device), group=copy.group)
    most = int(max(int(c.item()) for c in counts))
    padded = torch.cat([mine, zero.expand(most - uses_here, micro_batches, *zero.shape)])
    flags = torch.cat([present, torch.zeros(most - uses_here, micro_batches, dtype=torch.uint8, device=device)])
    gathered = [torch.empty_like(padded) for _ in range(members)]
    gathered_flags = [torch.empty_like(flags) for _ in range(members)]
    dist.all_gather(gathered, padded, group=copy.group)
    dist.all_gather(gathered_flags, flags, group=copy.group)
    holders = len(copy.stages)
    total: torch.Tensor | None = None
    for replica, micro_batch in ((d, m) for d in range(copy.replicas) for m in range(micro_batches)):
        uses = [(holder, use) for holder in range(replica * holders, (replica + 1) * holders)
                for use in range(int(counts[holder].item()))]
        per_batch: torch.Tensor | None = None
        for holder, use in reversed(uses):  # stages in order, uses in forward order: walk it backwards
            if gathered_flags[holder][use, micro_batch]:
                part = gathered[holder][use, micro_batch]
                per_batch = part if per_batch is None else per_batch + part
        if per_batch is not None:
            total = per_batch if total is None else total + per_batch
    return total if total is not None else zero


def holders(stage_modules: Sequence[nn.Module]) -> dict[str, tuple[int, ...]]:
    """Parameter name -> the stages holding a copy of it, for names held by more than one stage."""
    stages_of: dict[str, list[int]] = {}
    for index, module in enumerate(stage_modules):
        for name, _ in module.named_parameters():
            stages_of.setdefault(name, []).append(index)
    return {name: tuple(stages) for name, stages in stages_of.items() if len(stages) > 1}
