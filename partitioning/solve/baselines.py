"""The splits other tools make by default, to compare plans against.

* ``uniform``: optimum-graphcore's default ``layers_per_ipu`` (all ``-1``):
  the transformer layers (blocks running items of the family's layer lists,
  or a layer's sub-layer blocks together), encoder then decoder, are spread
  evenly, the remainder going to the last device.  Blocks that are not
  layers stay with the layer before them (the embedding goes on the first
  stage, the head on the last).
* ``parameters``: DeepSpeed's ``partition_method="parameters"``: the most
  balanced split of parameter counts, a tied weight counted in every block
  that uses it (as DeepSpeed counts a ``TiedLayerSpec`` at each occurrence).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from common.errors import UserError
from partitioning.plan import Block, block_layers, layer_of
from partitioning.solve.partition import Segment, check_stage_count, min_max_split


def layer_starts(blocks: Sequence[Block], layer_lists: Sequence[str]) -> list[int]:
    """Indices of the blocks where a layer begins (a layer block, or a layer's first sub-layer block)."""
    starts, previous = [], None
    for i, block in enumerate(blocks):
        layer = layer_of(block.first_module, layer_lists)
        if block_layers(block, layer_lists) or (layer is not None and layer != previous):
            starts.append(i)
        previous = layer
    return starts


def uniform_split(blocks: Sequence[Block], stages: int, layer_lists: Sequence[str]) -> list[Segment]:
    check_stage_count(len(blocks), stages)
    layers = layer_starts(blocks, layer_lists)
    if len(layers) < stages:
        raise UserError(f"the uniform split needs at least one layer per stage: {len(layers)} layers, {stages} stages")
    quotient, remainder = divmod(len(layers), stages)
    per_stage = [quotient] * stages
    per_stage[-1] += remainder
    # A stage ends just before the first layer of the next one; leading blocks go to stage 0.
    starts = [0]
    taken = 0
    for count in per_stage[:-1]:
        taken += count
        starts.append(layers[taken])
    ends = [start - 1 for start in starts[1:]] + [len(blocks) - 1]
    return list(zip(starts, ends))


def parameter_counts(blocks: Sequence[Block], shared_bytes: Mapping[str, int]) -> list[int]:
    """Parameter bytes of each block with every shared weight counted at each of its users."""
    first_user: dict[str, int] = {}
    for index, block in enumerate(blocks):
        for name in block.shared:
            first_user.setdefault(name, index)
    return [block.param_bytes + sum(shared_bytes[name] for name in block.shared if first_user[name] != index)
            for index, block in enumerate(blocks)]


def parameter_balanced_split(blocks: Sequence[Block], stages: int, shared_bytes: Mapping[str, int]) -> list[Segment]:
    weights = parameter_counts(blocks, shared_bytes)
    prefix = [0]
    for weight in weights:
        prefix.append(prefix[-1] + weight)
    segments = min_max_split(len(blocks), stages, lambda s, i, j: float(prefix[j + 1] - prefix[i]))
    assert segments is not None  # no constraint: every split is allowed
    return segments
