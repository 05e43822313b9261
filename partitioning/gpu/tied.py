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
    """One chunk's copy of a parameter that several chunks hold, and what each of its uses sent back.

    ``stages``: the pipeline ranks (in the ``pp`` group) holding a copy; ``group``: those ranks in every one
    of the ``replicas``, replica-major; ``chunk``: the stage index of this copy.
    """

    name: str
    stages: tuple[int, ...]
    parameter: nn.Parameter
    group: dist.ProcessGroup  # every holder of every replica, replica-major
    chunk: int = 0
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


def ordered_sum(copies: Sequence[TiedCopy], micro_batches: int, ranks_of: Sequence[int]) -> torch.Tensor:
    """All holders' use gradients, summed per micro-batch from the last use back, then over micro-batches
    (replica by replica).

    ``copies``: this rank's copies of one weight, in chunk order; ``ranks_of``: the rank of every chunk.
    """
    for copy in copies:
        if len(copy.per_micro_batch) != micro_batches:
            raise UserError(f"{copy.name}: {len(copy.per_micro_batch)} forwards in a step of {micro_batches} "
                            f"micro-batches")
    first = copies[0]
    zero = torch.zeros_like(first.parameter)
    device = zero.device  # collectives run where the weight lives (NCCL needs CUDA tensors)
    counts = torch.zeros(len(ranks_of), dtype=torch.long, device=device)  # uses per chunk
    parts, flags = [], []
    for copy in copies:
        uses = len(copy.per_micro_batch[0])
        counts[copy.chunk] = uses
        # [use, micro-batch, *weight]: a missing gradient (no use reached) is a zero flagged absent
        parts.append(torch.stack([torch.stack([g if g is not None else zero for g in per]) if uses else zero[None][:0]
                                  for per in copy.per_micro_batch], dim=1))
        flags.append(torch.tensor([[g is not None for g in per] for per in copy.per_micro_batch],
                                  dtype=torch.uint8, device=device).reshape(micro_batches, uses).T)
        copy.per_micro_batch.clear()
    mine, present = torch.cat(parts), torch.cat(flags)
    holders = len(first.stages)
    members = holders * first.replicas  # the group's ranks: replica-major, the holders in order within one
    all_counts = [torch.zeros_like(counts) for _ in range(members)]
    dist.all_gather(all_counts, counts, group=first.group)
    most = max(int(c.sum()) for c in all_counts)
    padded = torch.cat([mine, zero.expand(most - len(mine), micro_batches, *zero.shape)])
    flagged = torch.cat([present, torch.zeros(most - len(mine), micro_batches, dtype=torch.uint8, device=device)])
    gathered = [torch.empty_like(padded) for _ in range(members)]
    gathered_flags = [torch.empty_like(flagged) for _ in range(members)]
    dist.all_gather(gathered, padded, group=first.group)
    dist.all_gather(gathered_flags, flagged, group=first.group)
    total: torch.Tensor | None = None
    for replica in range(first.replicas):
        # (member of the group, row): this replica's chunks in order, uses in forward order
        rows: list[tuple[int, int]] = []
        offset = dict.fromkeys(range(members), 0)
        for chunk, rank in enumerate(ranks_of):
            member = replica * holders + first.stages.index(rank) if rank in first.stages else -1
            for _ in range(int(all_counts[member][chunk]) if member >= 0 else 0):
                rows.append((member, offset[member]))
                offset[member] += 1
        for micro_batch in range(micro_batches):
            per_batch: torch.Tensor | None = None
            for member, row in reversed(rows):  # walk the uses backwards, as autograd does
                if gathered_flags[member][row, micro_batch]:
                    part = gathered[member][row, micro_batch]
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
