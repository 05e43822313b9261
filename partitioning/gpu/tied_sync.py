"""A pipeline run's tied weights: their copies made equal, watched, and given the one weight's gradient.

:class:`partitioning.gpu.pipelining.PipelineRun` holds one :class:`TiedWeights`; the sums themselves are in
:mod:`partitioning.gpu.tied` (after the schedule) and :mod:`partitioning.gpu.tied_stream` (during it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from common.errors import UserError
from partitioning.gpu.tied import TiedCopy, ordered_sum
from partitioning.gpu.tied_stream import TiedStream, stream_backward
from partitioning.schedules import chain_streams
from stateless.torch_internals import new_group


class TiedWeights:
    """This rank's copies of the weights several chunks hold (``holding``: name -> chunks), kept equal.

    ``chunks`` / ``modules``: this rank's chunks and their modules; ``ranks_of``: every chunk's rank in a
    replica of ``stages`` ranks.  Under ``tied_sum="ordered"`` every copy's uses are watched, and with
    ``stream`` (:func:`partitioning.schedules.streams`, and per weight
    :func:`partitioning.schedules.chain_streams`) summed as ``chunk_stages`` run their backwards.
    """

    def __init__(self, holding: dict[str, tuple[int, ...]], chunks: Sequence[int], modules: Sequence[nn.Module],
                 ranks_of: Sequence[int], stages: int, replicas: int, tied_sum: str) -> None:
        self.ranks_of, self.replicas, self.tied_sum = ranks_of, replicas, tied_sum
        self.copies: list[TiedCopy] = []
        self.streams: dict[str, TiedStream] = {}
        self.holding = holding
        local = {chunk: dict(module.named_parameters()) for chunk, module in zip(chunks, modules)}
        for name, holders in sorted(holding.items()):
            ranks = tuple(sorted({ranks_of[c] for c in holders}))
            # every rank takes part in creating every group; global rank = replica * ranks per replica + rank
            group = new_group([d * stages + r for d in range(replicas) for r in ranks])
            mine = [c for c in holders if c in local]
            if not mine:
                continue
            assert group is not None, name  # a rank holding a copy is one of the group's
            source = local[mine[0]][name]  # the first holder's copy, where this rank holds it
            with torch.no_grad():  # from replica 0's first holder: the group's ranks are replica-major
                dist.broadcast(source.data, group=group, group_src=ranks.index(ranks_of[holders[0]]))
                for chunk in mine[1:]:
                    local[chunk][name].data.copy_(source.data)
            self.copies += [TiedCopy(name, ranks, local[chunk][name], group, chunk=chunk, replicas=replicas)
                            for chunk in mine]

    def watch(self, chunks: Sequence[int], modules: Sequence[nn.Module], chunk_stages: Sequence[Any],
              micro_batches: int, schedule: str, stream: bool) -> None:
        """Record every use's gradient (``ordered``), and sum them as the backward runs where ``stream``."""
        if not self.copies or self.tied_sum != "ordered":
            return
        for chunk, module in zip(chunks, modules):
            module.register_forward_hook(_watcher([c for c in self.copies if c.chunk == chunk]))
        if not stream:
            return
        for name in sorted({copy.name for copy in self.copies}):
            if not chain_streams(self.holding[name], self.ranks_of):
                continue
            copies = [copy for copy in self.copies if copy.name == name]
            for copy in copies:
                copy.streamed = True
            self.streams[name] = TiedStream(copies, self.holding[name], self.ranks_of, micro_batches, schedule)
        for chunk, stage in zip(chunks, chunk_stages):
            stream_backward(stage, [s for s in self.streams.values() if chunk in s.copies])

    def sync(self, micro_batches: int, scale_grads: bool, replayed: Sequence[int]) -> None:
        """Give every copy the gradient of the one weight it stands for (``replayed``: chunks that replay values)."""
        by_name: dict[str, list[TiedCopy]] = {}
        for copy in self.copies:
            if copy.parameter.grad is None and not copy.reached:
                if copy.chunk not in replayed:
                    raise UserError(f"stage {copy.chunk} holds {copy.name} but computed no gradient for it")
                # a replica read only to recompute a value (outside autograd) contributes nothing itself
                copy.parameter.grad = torch.zeros_like(copy.parameter)
            copy.reached = False
            by_name.setdefault(copy.name, []).append(copy)
        for name, copies in by_name.items():
            if self.tied_sum == "allreduce":
                grads = [copy.parameter.grad for copy in copies if copy.parameter.grad is not None]
                total = sum(grads[1:], grads[0])  # grads[0] + grads[1] + ..., grads[0] itself when alone
                dist.all_reduce(total, group=copies[0].group)
                if self.replicas > 1:
                    total = total / self.replicas  # as DDP averages the other parameters
            else:  # the sum replaces the copies' own gradients (streamed, autograd left them out)
                if name in self.streams:
                    total = self.streams[name].finish()
                else:
                    total = next(c.parameter.grad for c in copies if c.parameter.grad is not None)  # overwritten
                    ordered_sum(copies, micro_batches, self.ranks_of, out=total)
                # the schedule divides a copy's own gradient by the micro-batch count, DDP the others' by the
                # replica count: so does the sum
                count = micro_batches * self.replicas if scale_grads else self.replicas
                if count > 1:
                    total.div_(count)
            for copy in copies:
                if copy.parameter.grad is None:
                    copy.parameter.grad = total if copy is copies[0] else total.clone()
                elif copy.parameter.grad is not total:
                    copy.parameter.grad.copy_(total)


def _watcher(copies: list[TiedCopy]) -> Callable[[nn.Module, object, object], None]:
    def watch(module: nn.Module, args: object, outputs: object) -> None:
        for copy in copies:  # returns None: a forward hook's result would replace the outputs
            copy.watch(outputs)
    return watch
