"""The splits other tools make by default, to compare plans against.

* ``uniform``: optimum-graphcore's default ``layers_per_ipu`` (all ``-1``):
  the transformer layers (blocks running items of the family's layer lists,
  or a layer's sub-layer blocks together), encoder then decoder, are spread
  evenly, the remainder going to the last device.  Blocks that are not
  layers stay with the layer before them (the embedding goes on the first
  stage, the head on the last).
* ``torchtitan``: torchtitan's ``generate_llm_fqn_per_model_part`` (its default
  ``input_weight = output_weight = 1``): the layers plus the embedding and the
  output, each counted as one layer, spread evenly, the extra ones going to
  the first stages; the embedding opens the first stage, norm and output close
  the last.
* ``hf``: Hugging Face's native pipeline split (5.x ``DistributedConfig(pp_size)``,
  ``layer_range_for_rank``): the items of ``model.layers`` (the first layer list)
  evenly, the remainder on the last rank, the embedding on the first and norm and
  head on the last: optimum-graphcore's rule over one layer list.
* ``parameters``: DeepSpeed's ``partition_method="parameters"``: the most
  balanced split of parameter counts, a tied weight counted in every block
  that uses it (as DeepSpeed counts a ``TiedLayerSpec`` at each occurrence).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from common.errors import UserError
from partitioning.plan import Block, block_layers, layer_of
from partitioning.solve.split import Segment, check_stage_count, min_max_split


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


def _split_at(blocks: Sequence[Block], layer_lists: Sequence[str], layers: list[int], per_stage: Sequence[int]
              ) -> list[Segment]:
    """Stages holding ``per_stage`` layers each (starts in ``layers``); leading blocks on the first, trailing on the last.

    A stage of no layers (torchtitan's first stage holding only the embedding) starts where the next would.
    """
    trailing = next((i for i in range(layers[-1] + 1, len(blocks))
                     if layer_of(blocks[i].first_module, layer_lists) is None), len(blocks))
    bounds = [*layers, trailing]
    starts, taken = [0], 0
    for count in per_stage[:-1]:
        taken += count
        starts.append(bounds[taken])
    segments = list(zip(starts, [start - 1 for start in starts[1:]] + [len(blocks) - 1]))
    if any(end < start for start, end in segments):
        raise UserError(f"the split leaves a stage empty: {list(per_stage)} layers per stage over {len(blocks)} blocks")
    return segments


def torchtitan_split(blocks: Sequence[Block], stages: int, layer_lists: Sequence[str]) -> list[Segment]:
    """torchtitan's rule: embedding and output one layer each, ``layers + 2`` spread evenly, extras first."""
    check_stage_count(len(blocks), stages)
    layers = layer_starts(blocks, layer_lists)
    effective = len(layers) + 2
    quotient, extra = divmod(effective, stages)
    if quotient < 1:
        raise UserError(f"torchtitan's split needs a layer per stage: {effective} layers counting embedding and "
                        f"output, {stages} stages")
    per_stage = [quotient + (k < extra) - (k == 0) - (k == stages - 1) for k in range(stages)]
    return _split_at(blocks, layer_lists, layers, per_stage)


def hf_native_split(blocks: Sequence[Block], stages: int, layer_lists: Sequence[str]) -> list[Segment]:
    """Hugging Face's native split: uniform over the first layer list (``model.layers``), remainder last."""
    return uniform_split(blocks, stages, layer_lists[:1])


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
    # Not spread: among equal bottlenecks the spreading is this partitioner's, not DeepSpeed's.
    segments = min_max_split(len(blocks), stages, lambda s, i, j: float(prefix[j + 1] - prefix[i]), spread=False)
    assert segments is not None  # no constraint: every split is allowed
    return segments
