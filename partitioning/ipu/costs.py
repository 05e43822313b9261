"""Per-block costs read off the plan, for stages the plan did not make.

The plan prices stages, not blocks.  A block's share of its stage is its
fraction of the stage's work (FLOPs, or measured seconds when the plan was
made on them) for compute, and of the stage's parameter + saved-activation
bytes for memory.  Moving a block to another IPU (the shared-weight rule) or
re-grouping blocks (``layers_per_ipu``, rebalancing) then moves these shares,
so every IPU number stays on the plan's own scale.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from partitioning.ipu.errors import IPUError
from partitioning.partition import Settings, min_max_split
from partitioning.plan import Plan, Stage

_SETTINGS = {f.name for f in dataclasses.fields(Settings)}

# Mk2 (GC200) In-Processor Memory, Graphcore's "900 MB": 1472 tiles of 624 KiB.
IPU_MEMORY_BYTES = 1472 * 624 * 1024


@dataclass(frozen=True)
class Share:
    seconds: float  # forward + backward per micro-batch
    memory_bytes: float


def _fractions(values: Sequence[float]) -> list[float]:
    total = sum(values)
    return [value / total for value in values] if total > 0 else [1 / len(values)] * len(values)


def _replica_bytes(plan: Plan, stage: Stage) -> float:
    """The bytes a stage holds for shared weights an earlier stage owns (the GPU pipeline's replicas).

    On IPUs every user of a shared weight runs on its owner's IPU, so no replica exists: these bytes
    belong to no block.
    """
    shared = plan.model.get("shared_bytes", {})
    first: dict[str, int] = {}
    for index, block in enumerate(plan.blocks):
        for name in block.shared:
            first.setdefault(name, index)
    start = next(index for index, block in enumerate(plan.blocks) if block.name == stage.blocks[0])
    used = {name for block in plan.blocks if block.name in stage.blocks for name in block.shared}
    copies = Settings(**{k: v for k, v in plan.settings.items() if k in _SETTINGS}).state_copies
    return copies * sum(shared.get(name, 0) for name in used if first[name] < start)


def block_shares(plan: Plan) -> dict[str, Share]:
    by_name = {block.name: block for block in plan.blocks}
    measured = bool(plan.settings.get("measured"))
    shares = {}
    for stage in plan.stages:
        blocks = [by_name[name] for name in stage.blocks]
        work = _fractions([(b.seconds or 0.0) if measured else b.flops for b in blocks])
        size = _fractions([b.param_bytes + b.activation_bytes for b in blocks])
        own = stage.memory_bytes - _replica_bytes(plan, stage)
        for block, w, s in zip(blocks, work, size):
            shares[block.name] = Share(stage.compute * w, own * s)
    return shares


def restage(plan: Plan, groups: Sequence[Sequence[str]]) -> list[Stage]:
    """Stages of consecutive block groups, priced from the plan's block shares.

    A cut is priced as the plan prices one (its tensors over the plan's
    ``bandwidth``) when the plan says what that bandwidth is.
    """
    shares = block_shares(plan)
    by_name = {block.name: block for block in plan.blocks}
    bandwidth = plan.settings.get("bandwidth")
    stages = []
    for index, group in enumerate(groups):
        last = index == len(groups) - 1
        send = 0.0 if last or not bandwidth else by_name[group[-1]].out_bytes / bandwidth
        stages.append(Stage(index=index, blocks=tuple(group), compute=sum(shares[n].seconds for n in group),
                            communication=send, memory_bytes=round(sum(shares[n].memory_bytes for n in group))))
    return stages


def memory_budget(available_memory_proportion: float) -> float:
    """Bytes of an IPU left for weights and activations.

    ``availableMemoryProportion`` is the share of tile memory matmuls and
    convolutions may take for temporaries, so what a plan keeps live must
    fit in the rest (a necessary condition; code and exchange buffers also
    take memory, which only compilation measures).
    """
    return IPU_MEMORY_BYTES * (1 - available_memory_proportion)


def rebalance(plan: Plan, budgets: Sequence[float], users: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """The contiguous split over ``len(budgets)`` IPUs with the least bottleneck under the shared-weight rule.

    ``users`` lists, per shared weight, the blocks using it in chain order.
    The rule runs the later users (T5's LM head) on the IPU of the first
    (the embedding's IPU 0); the plan did not know, so that IPU would carry
    its stage plus the head, and a last stage holding only the head would
    leave its IPU idle.  This split charges moved blocks to the group of
    their weight's first user, keeps another block in every group, and keeps
    every IPU within its memory budget.
    """
    shares = block_shares(plan)
    names = [block.name for block in plan.blocks]
    ipus = len(budgets)
    moved = {name for group in users for name in group[1:]}
    kept = [0 if name in moved else 1 for name in names]
    if sum(kept) < ipus:
        raise IPUError(f"cannot place {len(names)} blocks on {ipus} IPUs: only {sum(kept)} are not later users of a "
                       f"shared weight; use fewer IPUs")
    # (index of a weight's first user, seconds and bytes of its later users)
    homes = [(names.index(group[0]), sum(shares[n].seconds for n in group[1:]),
              sum(shares[n].memory_bytes for n in group[1:])) for group in users if len(group) > 1]
    work, memory, count = [0.0], [0.0], [0]
    for name, keep in zip(names, kept):
        work.append(work[-1] + shares[name].seconds * keep)
        memory.append(memory[-1] + shares[name].memory_bytes * keep)
        count.append(count[-1] + keep)

    def cost(s: int, i: int, j: int) -> float:
        return work[j + 1] - work[i] + sum(seconds for first, seconds, _ in homes if i <= first <= j)

    def occupied(s: int, i: int, j: int) -> bool:
        return count[j + 1] - count[i] > 0

    def fits(s: int, i: int, j: int) -> bool:
        need = memory[j + 1] - memory[i] + sum(size for first, _, size in homes if i <= first <= j)
        return occupied(s, i, j) and need <= budgets[s]

    # When nothing fits, the best split regardless of memory lets validation name the IPU that overflows.
    segments = min_max_split(len(names), ipus, cost, fits) or min_max_split(len(names), ipus, cost, occupied)
    assert segments is not None  # enough blocks stay outside IPU 0's shared users: checked above
    return [tuple(names[i:j + 1]) for i, j in segments]
