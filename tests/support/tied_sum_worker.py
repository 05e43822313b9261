"""A torchrun rank of ``test_tied_sum.py``: ``ordered_sum`` on made-up use gradients, against one process's order.

Every rank draws the same gradients (one seed), keeps those of its own chunks' uses and writes, per case, whether
the sum it got is ``torch.equal`` to the single-process order and to another order (which must differ: the case
can tell orders apart).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from partitioning.gpu.tied import TiedCopy, ordered_sum
from stateless.torch_internals import new_group

SHAPE = (33, 7)
# name -> (rank of every chunk, uses of the weight per chunk, micro-batches, (chunk, use, micro-batch) not reached)
CASES = {
    # 3 holders, looped: the walk 4 (r1) -> 2 (r2) -> 1 (r1) -> 0 (r0) passes through rank 1 twice, and rank 1
    # sends more partial sums than it leaves in flight
    "relay": ((0, 1, 2, 0, 1, 2), {0: 1, 1: 2, 2: 1, 4: 2}, 5, {(2, 0, 1), (4, 1, 3)}),
    # first and last chunk (an embedding and its head), two uses on the last; one micro-batch reaches no use
    "ends": ((0, 1, 2), {0: 1, 2: 2}, 3, {(0, 0, 1), (2, 0, 1), (2, 1, 1)}),
}


def gradients(uses: dict[int, int], micro_batches: int, missing: set[tuple[int, int, int]]) -> dict:
    """(chunk, use, micro-batch) -> gradient, of magnitudes far apart (so that the order of additions shows)."""
    torch.manual_seed(0)
    return {(chunk, use, mb): torch.randn(SHAPE) * 10.0 ** torch.randint(-6, 7, SHAPE)
            for chunk, count in sorted(uses.items()) for use in range(count) for mb in range(micro_batches)
            if (chunk, use, mb) not in missing}


def in_order(grads: dict, uses: dict[int, int], micro_batches: int, backwards: bool) -> torch.Tensor:
    total = None
    for mb in range(micro_batches):
        walk = [grads[(c, u, mb)] for c in sorted(uses) for u in range(uses[c]) if (c, u, mb) in grads]
        per_batch = None
        for grad in reversed(walk) if backwards else walk:
            per_batch = grad.clone() if per_batch is None else per_batch + grad
        if per_batch is not None:
            total = per_batch if total is None else total + per_batch
    return torch.zeros(SHAPE) if total is None else total


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for name, (ranks_of, uses, micro_batches, missing) in CASES.items():
        grads = gradients(uses, micro_batches, missing)
        stages = tuple(sorted({ranks_of[c] for c in uses}))
        group = new_group(stages)
        if rank not in stages:
            continue
        assert group is not None, rank
        copies = []
        for chunk in sorted(c for c in uses if ranks_of[c] == rank):
            copy = TiedCopy("w", stages, torch.nn.Parameter(torch.zeros(SHAPE)), group, chunk=chunk)
            kept = {key: grad.clone() for key, grad in grads.items() if key[0] == chunk}  # the sum adds into them
            copy.per_micro_batch = [[kept.get((chunk, u, mb)) for u in range(uses[chunk])] for mb in range(micro_batches)]
            copies.append(copy)
        got = torch.full(SHAPE, float("nan"))
        ordered_sum(copies, micro_batches, ranks_of, out=got)
        record = {"case": name, "rank": rank, "equal": torch.equal(got, in_order(grads, uses, micro_batches, True)),
                  "forward_order_equal": torch.equal(got, in_order(grads, uses, micro_batches, False))}
        (out / f"{name}-{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
