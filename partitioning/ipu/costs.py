"""Per-block compute read off the plan, for stages the plan did not make.

The plan prices stages, not blocks.  A block's share of its stage is its
fraction of the stage's work (FLOPs, or measured seconds when the plan was
made on them) for compute, and of the stage's parameter + saved-activation
bytes for the plan's own (GPU) memory figure.  Moving a block to another IPU
(the shared-weight rule) or re-grouping blocks (``layers_per_ipu``,
rebalancing) then moves these shares, so every IPU time stays on the plan's
own scale.  IPU memory is not a share: :mod:`partitioning.ipu.memory` models
it from the blocks' bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from partitioning.ipu.errors import IPUError
from partitioning.plan import Plan, Stage
from partitioning.settings import Settings
from partitioning.solve.split import min_max_split


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
    copies = Settings.from_plan(plan.settings).state_copies
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


def rebalance(plan: Plan, ipus: int, users: Sequence[Sequence[str]],
              fits: Callable[[int, Sequence[str], Sequence[str]], bool]) -> list[tuple[str, ...]]:
    """The contiguous split over ``ipus`` IPUs with the least bottleneck under the shared-weight rule.

    ``users`` lists, per shared weight, the blocks using it in chain order.
    The rule runs the later users (T5's LM head) on the IPU of the first
    (the embedding's IPU 0); the plan did not know, so that IPU would carry
    its stage plus the head, and a last stage holding only the head would
    leave its IPU idle.  This split charges moved blocks to the group of
    their weight's first user, keeps another block in every group, and keeps
    every IPU within memory: ``fits(ipu, blocks, moved_in)``.
    """
    shares = block_shares(plan)
    names = [block.name for block in plan.blocks]
    moved = {name for group in users for name in group[1:]}
    kept = [0 if name in moved else 1 for name in names]
    if sum(kept) < ipus:
        raise IPUError(f"cannot place {len(names)} blocks on {ipus} IPUs: only {sum(kept)} are not later users of a "
                       f"shared weight; use fewer IPUs")
    # (index of a weight's first user, a later user moved there, its seconds): each moved block once, however
    # many names its weight goes by (the plan's and the form's) or however many shared weights it uses.
    home: dict[str, int] = {}
    for group in users:
        for name in group[1:]:
            home.setdefault(name, names.index(group[0]))
    homes = [(first, (name,), shares[name].seconds) for name, first in home.items()]
    work, count = [0.0], [0]
    for name, keep in zip(names, kept):
        work.append(work[-1] + shares[name].seconds * keep)
        count.append(count[-1] + keep)

    def cost(s: int, i: int, j: int) -> float:
        return work[j + 1] - work[i] + sum(seconds for first, _, seconds in homes if i <= first <= j)

    def occupied(s: int, i: int, j: int) -> bool:
        return count[j + 1] - count[i] > 0

    def within_memory(s: int, i: int, j: int) -> bool:
        group = [name for name in names[i:j + 1] if name not in moved]
        moved_in = [name for first, later, _ in homes if i <= first <= j for name in later]
        return occupied(s, i, j) and fits(s, group, moved_in)

    # When nothing fits, the best split regardless of memory lets validation name the IPU and term that overflow.
    # Not spread: the layouts stay optimum-graphcore's published ones (the embedding and head alone on IPU 0).
    segments = (min_max_split(len(names), ipus, cost, within_memory, spread=False)
                or min_max_split(len(names), ipus, cost, occupied, spread=False))
    assert segments is not None  # enough blocks stay outside IPU 0's shared users: checked above
    return [tuple(names[i:j + 1]) for i, j in segments]
