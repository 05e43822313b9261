"""What the engine's multi-stage schedules need of our stages: placement checks and backward adaptations.

See :mod:`partitioning.gpu.pipelining` for when each applies.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from common.errors import UserError
from partitioning.plan import Plan
from partitioning.schedules import SCHEDULES, check_runs, check_virtual_stages, placement
from stateless.torch_internals import drop_warmup_messages_to, stage_backward_weight


def check_placement(plan: Plan, schedule: str, world: int, micro_batches: int) -> int:
    """The chunks per rank of ``plan`` run by ``schedule`` on ``world`` ranks (one line for what cannot run)."""
    if schedule not in SCHEDULES:
        raise UserError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    ranks = plan.ranks
    if max(ranks) + 1 != world:
        raise UserError(f"the plan runs on {max(ranks) + 1} ranks but {world} ranks run")
    virtual = len(ranks) // world
    if set(Counter(ranks).values()) != {virtual} or virtual * world != len(ranks):
        raise UserError(f"the plan gives the ranks unequal numbers of stages: {ranks}")
    check_virtual_stages(schedule, virtual)
    expected = list(placement(schedule, world, virtual))
    if ranks != expected:
        raise UserError(f"the plan places its stages on ranks {ranks}, the {schedule} schedule on {expected}: "
                        f"re-plan with partition-model --schedule {schedule}")
    check_runs(schedule, world, virtual, micro_batches)
    return virtual


def no_self_warmup(stage: Any) -> None:
    """Drop the messages a stage's communicator warm-up would send its own rank.

    The traced frontend's warm-up exchanges a dummy tensor with the ranks of
    the neighbouring stages; in a V (two adjacent chunks on one rank) that is
    the rank itself, which gloo cannot pair ("Pair is not connected").  The
    runtime itself hands a same-rank neighbour its tensors in memory.
    """
    drop_warmup_messages_to(stage, dist.get_rank())


def weight_groups_share_nodes(stage: Any) -> None:
    """Run the engine's weight-gradient step keeping the graph until its last parameter group is done.

    ``stage_backward_weight`` runs one ``autograd.grad`` per parameter group
    and frees the graph after each; in T5 and GPT-2 two groups reach common
    nodes (a weight-only subgraph, such as the position bias, feeding several
    places), so the second one fails ("backward through the graph a second
    time").  The graph is dropped with the step's saved state right after.
    """
    original = stage.backward_maybe_with_nosync

    def backward(backward_type: str, bwd_kwargs: dict, last_backward: bool = False) -> Any:
        if backward_type != "weight":
            return original(backward_type, bwd_kwargs, last_backward=last_backward)
        return stage_backward_weight(stage.submod.parameters(), bwd_kwargs["param_groups"], retain_graph=True), None
    stage.backward_maybe_with_nosync = backward


def weight_only_senders(plan: Plan) -> set[int]:
    """The chunks that send on a value made from weights alone (no activation in its making) with a gradient.

    Such a value is one the costing found recomputable (its slice reads
    parameters, constants and model inputs only) that carries a gradient,
    where a later chunk receives it instead of recomputing it (T5's position
    bias, planned without recomputation).  The engine's input-gradient step
    follows outputs back to inputs only, and its weight step starts where the
    weight paths meet that input path: the gradient arriving for such a value
    is lost in part (measured: T5's decoder ``relative_attention_bias``
    gradient off by a quarter), so its maker runs its whole backward in I.
    """
    chunk_of = {index: stage.index for stage in plan.stages
                for index, block in enumerate(plan.blocks) if block.name in stage.blocks}
    senders = set()
    for value in plan.values:
        if value.recompute is None or not value.recompute.grad:
            continue
        maker = chunk_of[value.produced]
        if any(chunk_of[use] != maker and value.key not in plan.stages[chunk_of[use]].recompute for use in value.uses):
            senders.add(maker)
    return senders


def full_backward_in_input_step() -> Callable[[], None]:
    """The engine's ``dw_builder``: I then runs the whole backward, and W this no-op."""
    return lambda: None
