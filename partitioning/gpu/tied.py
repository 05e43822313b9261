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


def ordered_sum(copies: Sequence[TiedCopy], micro_batches: int, ranks_of: Sequence[int], out: torch.Tensor) -> None:
    """All holders' use gradients, summed per micro-batch from the last use back, then over micro-batches
    (replica by replica), into ``out``.

    ``copies``: this rank's copies of one weight, in chunk order; ``ranks_of``: the rank of every chunk.
    Every member of the group walks the same uses in the same order: the member holding a use
    broadcasts it (and lets it go), every member adds it to its own running sum.  So besides the
    gradients it kept, a holder needs three tensors of the weight's size (the one received, the
    micro-batch's sum, ``out``), not every holder's gradients at once.
    """
    for copy in copies:
        if len(copy.per_micro_batch) != micro_batches:
            raise UserError(f"{copy.name}: {len(copy.per_micro_batch)} forwards in a step of {micro_batches} "
                            f"micro-batches")
    first = copies[0]
    device = out.device  # collectives run where the weight lives (NCCL needs CUDA tensors)
    counts = torch.zeros(len(ranks_of), dtype=torch.long, device=device)  # uses per chunk
    mine: list[list[torch.Tensor | None]] = []  # [row (chunk order, then forward order)][micro-batch]
    for copy in copies:
        uses = len(copy.per_micro_batch[0])
        counts[copy.chunk] = uses
        mine += [[per[use] for per in copy.per_micro_batch] for use in range(uses)]
        copy.per_micro_batch.clear()
    holders = len(first.stages)
    members = holders * first.replicas  # the group's ranks: replica-major, the holders in order within one
    all_counts = [torch.zeros_like(counts) for _ in range(members)]
    dist.all_gather(all_counts, counts, group=first.group)
    most = max(int(c.sum()) for c in all_counts)
    present = torch.zeros(most, micro_batches, dtype=torch.uint8, device=device)  # a use reached or not
    for row, per in enumerate(mine):
        present[row] = torch.tensor([g is not None for g in per], dtype=torch.uint8)
    gathered_flags = [torch.empty_like(present) for _ in range(members)]
    dist.all_gather(gathered_flags, present, group=first.group)
    flags = [flag.tolist() for flag in gathered_flags]
    me = dist.get_rank(first.group)
    received = torch.empty_like(out)
    started = False
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
                if not flags[member][row][micro_batch]:
                    continue
                if member == me:
                    part = mine[row][micro_batch]
                    assert part is not None
                    mine[row][micro_batch] = None
                    part = part.contiguous()  # gloo sends contiguous tensors only
                else:
                    part = received
                dist.broadcast(part, group=first.group, group_src=member)
                if per_batch is None:
                    per_batch = part.clone() if part is received else part
                else:
                    per_batch.add_(part)
            if per_batch is not None:
                if started:
                    out.add_(per_batch)
                else:
                    out.copy_(per_batch)
                    started = True
    if not started:
        out.zero_()


def holders(stage_modules: Sequence[nn.Module]) -> dict[str, tuple[int, ...]]:
    """Parameter name -> the stages holding a copy of it, for names held by more than one stage."""
    stages_of: dict[str, list[int]] = {}
    for index, module in enumerate(stage_modules):
        for name, _ in module.named_parameters():
            stages_of.setdefault(name, []).append(index)
    return {name: tuple(stages) for name, stages in stages_of.items() if len(stages) > 1}
