"""The ordered tied-weight sum run during the schedule, micro-batch by micro-batch (see :mod:`partitioning.gpu.tied`).

In a linear pipeline whose backward of a micro-batch is one piece per chunk,
chunk ``c`` starts its backward of micro-batch ``m`` only once it has received
the gradient of its outputs, which chunk ``c + 1`` sends at the end of its own
backward of ``m``, and so on up the chain: every later chunk's backward of
``m`` is done before ``c``'s starts.  So the one-process order of a tied
weight's sum (per micro-batch from the last use back; micro-batches in
order) can run as the backward goes.  When a holding chunk has finished its
backward of ``m`` (:func:`stream_backward` wraps the engine's
``backward_one_chunk``), it receives the partial sum from the next later
holder, adds its own uses of ``m`` from the last back, and sends it on to the
next earlier holder (an ``isend``) or, on the first holder, adds it into the
running total.  Its use gradients of ``m`` are dropped at once.  After the
schedule the first holder broadcasts the total to every holder.

No deadlock: the later holder posted its ``isend`` right after its backward
of ``m``, before the schedule posted that chunk's activation-gradient sends
on which the receiver's backward of ``m`` waited, so a receive never waits for
a send not yet posted.  The messages go on the weight's own group (not the
stages' group, whose P2P the schedule posts), tagged by receiving chunk and
micro-batch.

A holder whose uses of ``m`` gave no gradient passes the partial sum on
unchanged, or starts it as ``-0.0`` everywhere, the additive identity of
IEEE floats (``-0.0 + x`` is ``x``, bit for bit, ``+0.0`` and ``-0.0``
included): the sum's bits are those of the additions it skips.

Where the backward of a chunk is split (zero-bubble schedules: weight
gradients computed late and out of order), runs micro-batches out of order
(LoopedBFS runs them backwards) or where data-parallel replicas sum replica
by replica (replica ``d``'s micro-batches come after all of replica
``d - 1``'s), :func:`partitioning.schedules.streams` says no and the sum runs when the schedule is
done (:func:`partitioning.gpu.tied.ordered_sum`); so does a weight whose chain
of holders crosses a link twice (:func:`partitioning.schedules.chain_streams`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from partitioning.gpu.tied import Partial, TiedCopy, Total, check_forwards
from partitioning.schedules import SINGLE


class TiedStream:
    """This rank's copies of one tied weight, summed in the one-process order as the backward runs.

    ``holders``: every chunk holding the weight; ``ranks_of``: the rank of every chunk; ``copies`` this
    rank's (marked ``streamed``: a use's gradient is read right after its chunk's backward, never kept).
    """

    def __init__(self, copies: Sequence[TiedCopy], holders: Sequence[int], ranks_of: Sequence[int],
                 micro_batches: int, schedule: str) -> None:
        first = copies[0]
        self.copies = {copy.chunk: copy for copy in copies}
        self.holders, self.ranks_of, self.micro_batches = sorted(holders), ranks_of, micro_batches
        self.group, self.stages, self.like = first.group, first.stages, first.parameter
        self.local: dict[tuple[int, int], Partial] = {}  # handed to a chunk of this rank: (chunk, micro-batch)
        self.sending: list[tuple[Any, torch.Tensor, bool]] = []  # isends not yet known done: buffer, its own
        self.spare: list[torch.Tensor] = []  # one buffer of this rank's own no longer needed, for the next receive
        self.total: Total | None = None  # on the first holder's rank
        self.done = 0  # micro-batches added to the total
        # Sends left in flight before a holder waits for its oldest.  With one chunk a rank (GPipe, 1F1B), the
        # receiver's backward of m waits for nothing this rank does after posting its backward of m's sends,
        # so waiting at a later micro-batch cannot deadlock; the distance in ranks is how far the receiver
        # runs behind in a balanced pipeline, so the bound costs no time there and caps the buffers
        # otherwise.  With several chunks a rank the receiver's backward of m may come after its other
        # chunk's backward of a later micro-batch, which needs this rank's later backwards: never wait.
        self.bound: dict[int, int | None] = {
            chunk: (self.ranks_of[chunk] - self.ranks_of[self._earlier(chunk)] if schedule in SINGLE else None)
            for chunk in self.copies if self.holders.index(chunk) > 0}
        later = {chunk: self.holders[self.holders.index(chunk) + 1] for chunk in self.copies if chunk != self.holders[-1]}
        self.receives = any(ranks_of[after] != ranks_of[chunk] for chunk, after in later.items())

    def _earlier(self, chunk: int) -> int:
        return self.holders[self.holders.index(chunk) - 1]

    def after_backward(self, chunk: int, micro_batch: int) -> None:
        """Chunk ``chunk`` has run its backward of ``micro_batch``: take the partial sum on a step."""
        copy = self.copies[chunk]
        position = self.holders.index(chunk)
        partial = Partial()
        if position + 1 < len(self.holders):  # from the next later holder
            later = self.holders[position + 1]
            if self.ranks_of[later] == self.ranks_of[chunk]:
                partial = self.local.pop((chunk, micro_batch))
            else:
                buffer = self.spare.pop() if self.spare else torch.empty_like(self.like)
                dist.recv(buffer, group=self.group, group_src=self.stages.index(self.ranks_of[later]),
                          tag=self._tag(chunk, micro_batch))
                partial = Partial(buffer)
        uses = copy.per_micro_batch[micro_batch]
        for use in reversed(range(len(uses))):  # the last use's gradient first, as autograd accumulates
            partial.add(uses[use])
            uses[use] = None
        if position == 0:
            self._add_to_total(partial, micro_batch)
            return
        earlier = self._earlier(chunk)
        if self.ranks_of[earlier] == self.ranks_of[chunk]:
            self.local[(earlier, micro_batch)] = partial
            return
        if partial.tensor is None:
            partial = Partial(torch.full_like(self.like, -0.0))
        assert partial.tensor is not None
        tensor = partial.tensor.contiguous()  # gloo sends contiguous tensors only
        own = partial.owned or tensor is not partial.tensor  # a borrowed gradient is never written to
        self.sending.append((dist.isend(tensor, group=self.group, group_dst=self.stages.index(self.ranks_of[earlier]),
                                        tag=self._tag(earlier, micro_batch)), tensor, own))
        self._reap(self.bound[chunk])

    def _tag(self, receiver: int, micro_batch: int) -> int:
        return receiver * self.micro_batches + micro_batch  # one message per receiving chunk and micro-batch

    def _reap(self, bound: int | None) -> None:
        """Forget the sends done; wait for the oldest while more than ``bound`` are in flight."""
        while self.sending and (self.sending[0][0].is_completed() or (bound is not None and len(self.sending) > bound)):
            work, tensor, own = self.sending.pop(0)
            work.wait()
            self._keep_spare(tensor, own)

    def _keep_spare(self, tensor: torch.Tensor, own: bool) -> None:
        if own and self.receives and not self.spare:  # one is all a receive needs; the rest is freed
            self.spare.append(tensor)

    def _add_to_total(self, partial: Partial, micro_batch: int) -> None:
        assert micro_batch == self.done, (micro_batch, self.done)  # streams() let only in-order backwards here
        self.done += 1
        if partial.tensor is None:
            return  # no use of this micro-batch reached a gradient
        if self.total is None:
            self.total = Total(torch.empty_like(self.like))
        self.total.add(partial.tensor)
        self._keep_spare(partial.tensor, partial.owned)

    def finish(self) -> torch.Tensor:
        """The step's sum on every holder (after the schedule): the first holder's total, broadcast."""
        self._reap(0)
        self.spare.clear()
        first = self.stages.index(self.ranks_of[self.holders[0]])
        # the first holder's total, or, where no use reached a gradient, +0.0 as the walk gives
        out = self.total.out if self.total is not None else torch.zeros_like(self.like)
        self.total, self.done = None, 0
        check_forwards(list(self.copies.values()), self.micro_batches)
        for copy in self.copies.values():
            assert copy.held() == 0, copy.name
            copy.per_micro_batch.clear()
        dist.broadcast(out, group=self.group, group_src=first)
        return out


def stream_backward(stage: Any, streams: Sequence[TiedStream]) -> None:
    """After ``stage``'s every backward of a micro-batch, the partial sums of the tied weights it holds step on."""
    original: Callable[..., Any] = stage.backward_one_chunk
    chunk = stage.stage_index

    def backward_one_chunk(bwd_chunk_id: int, *args: Any, **kwargs: Any) -> Any:
        result = original(bwd_chunk_id, *args, **kwargs)
        for stream in streams:
            stream.after_backward(chunk, bwd_chunk_id)
        return result
    stage.backward_one_chunk = backward_one_chunk
