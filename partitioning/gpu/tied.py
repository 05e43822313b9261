"""Tied weights across pipeline stages: which stages hold a copy, and the gradient every copy must get.

The engine gives each stage that uses a parameter its own copy and never
combines their gradients.  Each copy records, per micro-batch, the gradient
each of its uses sends back; the copies then add them up in one fixed
order: micro-batch by micro-batch, from the last use back to the first, the
micro-batch sums added in micro-batch order.  That is the order in which
single-process autograd accumulates a leaf used several times (the last
use's gradient arrives first), so every copy gets the single-process
gradient bit for bit.

Two ways run that order.  Where every chunk's backward of a micro-batch is
one piece, in micro-batch order (:func:`partitioning.gpu.tied_stream.streams`),
it runs during the schedule (:class:`partitioning.gpu.tied_stream.TiedStream`),
a copy holds one micro-batch's gradients at a time and autograd no longer
adds them into the copy's own ``.grad`` (the sum replaces it).  Elsewhere
(:func:`ordered_sum`) it runs when the schedule is done, at the price of
keeping uses x micro-batches gradients of the weight until then.  Both fold
with :class:`Partial` and :class:`Total`.

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

from common.errors import UserError
from stateless.torch_internals import autograd_sequence_nr, tree_leaves


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
    streamed: bool = False  # summed during the schedule (partitioning.gpu.tied_stream), not after it
    reached: bool = False  # a use's gradient arrived in this step
    most_held: int = 0  # the most use gradients this copy held at once (how far the memory grows)
    uses: int = 0  # of the copy in one micro-batch's forward

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
                    uses.append((autograd_sequence_nr(node), node, index))
                pending.append(following)
        grads: list[torch.Tensor | None] = [None] * len(uses)
        self.uses = len(uses)
        for position, (_, node, index) in enumerate(sorted(uses, key=lambda use: use[0])):  # forward order
            node.register_hook(self._keep(grads, position, index))
        self.per_micro_batch.append(grads)

    def _keep(self, grads: list[torch.Tensor | None], position: int, index: int) -> Callable[..., object]:
        def keep(grad_inputs: tuple[torch.Tensor | None, ...], _: object) -> tuple[torch.Tensor | None, ...]:
            gradient = grad_inputs[index]
            if gradient is not None:
                self.reached = True
                # Streamed, the tensor is autograd's own, read once this chunk's backward of the micro-batch is
                # done and never written: holding this reference keeps autograd from stealing it or adding into
                # it in place (both need it unshared).  The end-of-step walk keeps a copy.
                grads[position] = gradient if self.streamed else gradient.detach().clone()
                self.most_held = max(self.most_held, self.held())
            if not self.streamed:
                return grad_inputs
            # Streamed, autograd does not add it into the copy's own gradient too: the stream's sum replaces that
            # one.  (Not where the backward is split: the engine's weight step differentiates through this edge.)
            return grad_inputs[:index] + (None,) + grad_inputs[index + 1:]
        return keep

    def held(self) -> int:
        """The use gradients this copy holds now."""
        return sum(grad is not None for grads in self.per_micro_batch for grad in grads)


class Partial:
    """One micro-batch's partial sum, from its last use back: the one order of additions, in one place.

    A use's gradient is not written to (autograd's own may be shared), so the first one is borrowed and
    the first addition to a borrowed sum makes a new tensor; an owned sum (received, or a kept copy) is
    added into in place.  The bits are the same either way.
    """

    def __init__(self, tensor: torch.Tensor | None = None) -> None:
        self.tensor, self.owned = tensor, tensor is not None

    def add(self, part: torch.Tensor | None, owned: bool = False) -> None:
        if part is None:
            return
        if self.tensor is None:
            self.tensor, self.owned = part, owned
        elif self.owned:
            self.tensor.add_(part)
        else:
            self.tensor, self.owned = self.tensor + part, True


class Total:
    """The micro-batch sums added in micro-batch order into ``out`` (the first one copied)."""

    def __init__(self, out: torch.Tensor) -> None:
        self.out, self.started = out, False

    def add(self, partial: torch.Tensor) -> None:
        if self.started:
            self.out.add_(partial)
        else:
            self.out.copy_(partial)
        self.started = True


def check_forwards(copies: Sequence[TiedCopy], micro_batches: int) -> None:
    """One recorded forward a micro-batch (a forward under grad mode outside the schedule would misplace them)."""
    for copy in copies:
        if len(copy.per_micro_batch) != micro_batches:
            raise UserError(f"{copy.name}: {len(copy.per_micro_batch)} forwards in a step of {micro_batches} "
                            f"micro-batches")


def ordered_sum(copies: Sequence[TiedCopy], micro_batches: int, ranks_of: Sequence[int], out: torch.Tensor) -> None:
    """All holders' use gradients, summed per micro-batch from the last use back, then over micro-batches
    (replica by replica), into ``out``.

    ``copies``: this rank's copies of one weight, in chunk order; ``ranks_of``: the rank of every chunk.
    Every member of the group walks the same uses in the same order.  A micro-batch's partial sum travels
    along its uses, from the last back to the first: the holder of a use adds its gradient to it in place,
    and only where the next use is another member's does the partial sum cross the link (an ``isend`` the
    sender waits for only when it has a few in flight).  The micro-batch's sum is added to the running
    total on the member that ended the first micro-batch's walk, which broadcasts the total once at the
    end.  So the link carries one tensor of the weight's size per change of holder per micro-batch, plus
    the broadcast, and no member copies a gradient it kept (the sum adds into them): the additions, their
    order and so the bits are those of one process.
    """
    check_forwards(copies, micro_batches)
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
    link = _Link(first.group, dist.get_rank(first.group), out)
    total, started = Total(out), False
    total_at = -1  # the member holding the running total
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
            walk = [(member, row) for member, row in reversed(rows) if flags[member][row][micro_batch]]
            if not walk:
                continue
            at, partial = walk[0][0], Partial()  # where the micro-batch's partial sum is; its value there
            for member, row in walk:  # the uses backwards, as autograd accumulates them
                if member != at:
                    partial, at = Partial(link.move(partial.tensor, at, member)), member
                if member == link.me:
                    part = mine[row][micro_batch]
                    assert part is not None
                    mine[row][micro_batch] = None
                    partial.add(part.contiguous(), owned=True)  # gloo sends contiguous tensors only
            if total_at < 0:
                total_at = at
            moved = link.move(partial.tensor, at, total_at)
            if moved is not None:
                total.add(moved)
                link.spare.append(moved)  # consumed: the next received partial sum lands in it
            started = True
    link.finish()
    if started:
        dist.broadcast(out, group=first.group, group_src=total_at)
    else:
        out.zero_()


PENDING = 2  # sends of one weight's ordered sum a member leaves in flight before it waits for the oldest


class _Link:
    """The point-to-point moves of one weight's ordered sum: tagged in walk order, a few sends in flight.

    Waiting for an earlier send cannot deadlock: every member posts its moves in walk order, so the
    earliest move not yet done has its send posted and its receiver waiting for it.
    """

    def __init__(self, group: dist.ProcessGroup, me: int, like: torch.Tensor) -> None:
        self.group, self.me, self.like = group, me, like
        self.sending: list[tuple[dist.Work | None, torch.Tensor]] = []  # kept alive until their sends complete
        self.spare: list[torch.Tensor] = []  # buffers of the weight's shape no longer needed
        self.tag = 0

    def move(self, partial: torch.Tensor | None, source: int, target: int) -> torch.Tensor | None:
        """``partial`` (on member ``source``) handed to ``target``: the tensor this member now holds of it."""
        if source == target:
            return partial
        self.tag += 1  # every member counts the same moves: a message's tag is its place in the walk
        if self.me == source:
            assert partial is not None
            self.sending.append((dist.isend(partial, group=self.group, group_dst=target, tag=self.tag), partial))
            if len(self.sending) > PENDING:  # bound the partial sums in flight: the oldest one's buffer is reused
                work, sent = self.sending.pop(0)
                if work is not None:
                    work.wait()
                self.spare.append(sent)
            return None
        if self.me == target:
            buffer = self.spare.pop() if self.spare else torch.empty_like(self.like)
            dist.recv(buffer, group=self.group, group_src=source, tag=self.tag)
            return buffer
        return None

    def finish(self) -> None:
        for work, _ in self.sending:
            if work is not None:
                work.wait()
        self.sending.clear()


def holders(stage_modules: Sequence[nn.Module]) -> dict[str, tuple[int, ...]]:
    """Parameter name -> the stages holding a copy of it, for names held by more than one stage."""
    stages_of: dict[str, list[int]] = {}
    for index, module in enumerate(stage_modules):
        for name, _ in module.named_parameters():
            stages_of.setdefault(name, []).append(index)
    return {name: tuple(stages) for name, stages in stages_of.items() if len(stages) > 1}
