"""Block granularity: sub-layer blocks, their merge back into layers, and the choice between the two per plan.

A family names the sub-layers of its repeated layer (T5Block -> self-attention,
cross-attention, feed-forward), so the chain can be costed once at sub-layer
granularity.  Merging each layer's sub-layer blocks gives the layer-level
chain exactly (FLOPs, parameters, the tensors crossing each layer boundary,
measured time); only saved-activation bytes become an upper bound (a tensor
two sub-layers save is counted twice).  Every split of the layer chain is a
split of the sub-layer chain with the same cost, so with no memory limit the
optimal sub-layer plan is never worse; it is better where cutting inside a
layer balances the stages more than the extra tensors crossing there cost.
``auto`` plans both and keeps the sub-layer plan only when its stage costs,
sorted from the largest down, are lower (the bottleneck first: the
partitioner's own order, :func:`partitioning.solve.split.min_max_split`;
memory limits are checked on each chain's own estimate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from common.errors import UserError
from partitioning.cost.costing import Chain
from partitioning.plan import Block, Plan, layer_of

AUTO, SUBLAYER = "auto", "sublayer"


def parse(text: str) -> str | int:
    """``auto``, ``sublayer`` or a positive number of layers per block."""
    if text in (AUTO, SUBLAYER):
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise UserError(f"granularity must be 'auto', 'sublayer' or a number of layers per block, got {text!r}")


def merge(chain: Chain, groups: Sequence[Sequence[int]], names: Sequence[str],
          modules: Sequence[tuple[str, ...]]) -> Chain:
    """The chain whose block ``k`` runs the consecutive blocks ``groups[k]`` of ``chain``."""
    blocks = []
    for group, name, runs in zip(groups, names, modules):
        parts = [chain.blocks[i] for i in group]
        seconds = [b.seconds for b in parts]
        blocks.append(Block(name=name, modules=runs, flops=sum(b.flops for b in parts),
                            param_bytes=sum(b.param_bytes for b in parts), out_bytes=parts[-1].out_bytes,
                            activation_bytes=sum(b.activation_bytes for b in parts),
                            seconds=None if None in seconds else sum(s for s in seconds if s is not None),
                            shared=tuple(dict.fromkeys(n for b in parts for n in b.shared)),
                            crossing=parts[-1].crossing))
    index = {old: new for new, group in enumerate(groups) for old in group}
    values = []
    for value in chain.values:
        uses = tuple(sorted({index[use] for use in value.uses}))
        if uses[-1] > index[value.produced]:  # still crosses a cut of the merged chain
            values.append(replace(value, produced=index[value.produced], uses=uses))
    return Chain(blocks=blocks, shared_bytes=dict(chain.shared_bytes), total_flops=chain.total_flops,
                 values=values)


def layer_chain(chain: Chain, layer_lists: Sequence[str]) -> Chain:
    """A sub-layer chain with each layer's blocks merged into one block named and cut like the layer."""
    groups: list[list[int]] = []
    names: list[str] = []
    modules: list[tuple[str, ...]] = []
    for i, block in enumerate(chain.blocks):
        layer = layer_of(block.first_module, layer_lists)
        if layer is not None and names and names[-1] == layer:
            groups[-1].append(i)
            continue
        groups.append([i])
        names.append(layer or block.name)
        modules.append((layer,) if layer is not None else block.modules)
    return merge(chain, groups, names, modules)


def choose(sublayer_chain: Chain, layer_lists: Sequence[str],
           plan_of: Callable[[Chain, str | int], Plan]) -> tuple[Plan, Chain]:
    """The better plan of the sub-layer chain and its layer chain (ties: layers), and its chain.

    ``plan_of(chain, granularity)`` plans a chain (granularity 1 or ``sublayer``, for the plan's record).
    """
    layers = layer_chain(sublayer_chain, layer_lists)
    candidates: list[tuple[Plan, Chain]] = []
    errors = []
    for chain, name in ((layers, 1), (sublayer_chain, SUBLAYER)):
        try:
            candidates.append((plan_of(chain, name), chain))
        except UserError as exc:  # too few blocks, or over the memory limit at this granularity
            errors.append(exc)
    if not candidates:
        raise errors[-1]
    if len({plan.settings.get("micro_batches") for plan, _ in candidates}) > 1:
        # --schedule auto chose different micro-batch counts: their stage costs are per different micro-batches
        return min(candidates, key=lambda c: c[0].prediction["step_time"])
    return min(candidates, key=lambda c: c[0].loads)  # min keeps the first (layers) on a tie
