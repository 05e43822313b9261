"""Gradients of recomputed values, returned to the stage that holds the value before them.

When a stage recomputes a value that carries a gradient (T5's relative
position bias, made from a trainable embedding), the gradient its layers
produce must still reach the parameters, and bit for bit as single-process
autograd would compute it.  Single-process autograd accumulates a value's
gradient in the order its uses run backward, the last use first; the sum
then flows into the parameters once.  Splitting that sum per stage (each
stage backpropagating into its own replica of the parameters) would add the
same terms in another order, which floats do not forgive.

So the recomputation is kept out of autograd and the sum travels as it does
when the value is sent, only backward: the recomputing stage turns its
replayed values into leaves of one :class:`_Return` node, whose backward
sends their accumulated gradients to the previous holder of the values (the
stage that made them, or the previous stage recomputing them).  There, an
:class:`_Inject` node, the last operation of that stage's forward, receives
them at the start of its backward, so they are the first term of the
holder's own accumulation, exactly where a received gradient would be.

Messages between a pair of stages go in one fixed order per micro-batch
(the link's values in index order), and micro-batches run backward in the
same order on every stage, so NCCL's in-order matching holds as well as
gloo's.  Where a rank runs several chunks, two links may join the same pair
of ranks: each link has its own tag (gloo matches per tag), and a link
between two chunks of one rank hands its tensors over in memory.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class GradientLink:
    """The values one stage recomputes with gradients, and the earlier stage their gradients go back to."""

    def __init__(self, sender: int, receiver: int, count: int) -> None:
        self.sender, self.receiver, self.count = sender, receiver, count
        self.group: dist.ProcessGroup | None = None  # set once the process group exists
        self.source, self.destination, self.tag = sender, receiver, 0  # ranks (chunk = rank until connected)
        self._sending: list[tuple[Any, torch.Tensor]] = []  # works in flight and the buffers they read
        self._local: list[torch.Tensor] = []  # sent to a chunk of the same rank, not yet received

    def connect(self, group: dist.ProcessGroup | None, source: int, destination: int, tag: int) -> None:
        """The process group, the ranks of the two chunks, and this link's own message tag."""
        self.group, self.source, self.destination, self.tag = group, source, destination, tag

    def __repr__(self) -> str:  # names the graph node's target in printed graphs
        return f"GradientLink({self.sender}->{self.receiver})"

    def recomputed(self, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """In the recomputing stage: the replayed values as leaves whose gradients go back."""
        if len(values) != self.count:
            raise AssertionError(f"{self!r} expects {self.count} values, got {len(values)}")
        detached = tuple(value.detach() for value in values)
        if not torch.is_grad_enabled():
            return detached
        # A Function's outputs need a gradient only when one of its inputs does: an anchor leaf.
        anchor = torch.zeros((), device=detached[0].device, requires_grad=True)
        return _Return.apply(self, anchor, *detached)

    def inject(self, carrier: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
        """In the holding stage, last: ``carrier`` unchanged; in backward, the returned gradients enter first."""
        if not (torch.is_grad_enabled() and carrier.requires_grad):
            return carrier
        return _Inject.apply(self, carrier, *values)

    def send(self, grads: tuple[torch.Tensor, ...]) -> None:
        if self.source == self.destination:
            self._local.extend(grad.detach() for grad in grads)
            return
        assert self.group is not None, "the gradient link has no process group"
        for grad in grads:
            buffer = grad.contiguous()
            self._sending.append((dist.isend(buffer, group=self.group, group_dst=self.destination, tag=self.tag), buffer))

    def receive(self, like: list[tuple[torch.Size, torch.dtype, torch.device]]) -> list[torch.Tensor]:
        if self.source == self.destination:
            taken, self._local = self._local[:len(like)], self._local[len(like):]
            return taken
        assert self.group is not None, "the gradient link has no process group"
        grads = []
        for shape, dtype, device in like:
            buffer = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(buffer, group=self.group, group_src=self.source, tag=self.tag)
            grads.append(buffer)
        return grads

    def finish(self) -> None:
        """Wait for the sends of a step (the receiver has taken them all by the time its backward ends)."""
        for work, _ in self._sending:
            work.wait()
        self._sending.clear()


class _Return(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, link: GradientLink, anchor: torch.Tensor, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.link = link
        return tuple(value.view_as(value) for value in values)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        ctx.link.send(grads)
        return (None, None, *([None] * len(grads)))


class _Inject(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, link: GradientLink, carrier: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
        ctx.link = link
        ctx.like = [(value.shape, value.dtype, value.device) for value in values]
        return carrier.view_as(carrier)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return (None, grad, *ctx.link.receive(ctx.like))
