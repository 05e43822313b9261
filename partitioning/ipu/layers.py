"""optimum-graphcore's manual layout, ``layers_per_ipu``, turned into the plan's stages.

A *layer* is an item of one of the model's layer lists (its family's repeated
layers; for T5, ``encoder.block.N`` and ``decoder.block.N``), counted across
the whole model as optimum-graphcore does for encoder-decoder models.
"""

from __future__ import annotations

from collections.abc import Sequence

from partitioning.ipu.errors import IPUError
from partitioning.plan import Block, block_layers, layer_of


def expand_layers_per_ipu(layers_per_ipu: Sequence[int], num_layers: int) -> list[int]:
    """Layer counts per IPU with every ``-1`` wildcard filled in.

    The layers not given to a fixed IPU are shared evenly by the wildcard
    IPUs, and the remainder goes to the last wildcard IPU, as in
    optimum-graphcore.
    """
    counts = list(layers_per_ipu)
    wildcards = [ipu for ipu, count in enumerate(counts) if count == -1]
    if wildcards:
        rest = num_layers - sum(count for count in counts if count != -1)
        if rest < 0:
            raise IPUError(f"layers_per_ipu {list(layers_per_ipu)} fixes more layers than the model's {num_layers}: "
                           f"lower the fixed counts")
        quotient, remainder = divmod(rest, len(wildcards))
        for ipu in wildcards:
            counts[ipu] = quotient
        counts[wildcards[-1]] += remainder
    if sum(counts) != num_layers:
        raise IPUError(f"layers_per_ipu {list(layers_per_ipu)} places {sum(counts)} layers but the model has "
                       f"{num_layers}: make the counts sum to {num_layers} or use -1 wildcards")
    return counts


def layer_ipus(layers_per_ipu: Sequence[int], num_layers: int) -> list[int]:
    """The IPU of every layer, in order (optimum-graphcore's ``get_layer_ipu``)."""
    return [ipu for ipu, count in enumerate(expand_layers_per_ipu(layers_per_ipu, num_layers)) for _ in range(count)]


def count_layers(blocks: Sequence[Block], layer_lists: Sequence[str]) -> int:
    return sum(len(block_layers(block, layer_lists)) for block in blocks)


def manual_stages(blocks: Sequence[Block], layers_per_ipu: Sequence[int],
                  layer_lists: Sequence[str]) -> list[tuple[str, ...]]:
    """The block names of each IPU's stage under ``layers_per_ipu``.

    A block without layers stays with the block before it (the final norm
    with the last layer); blocks before the first layer go to IPU 0, where
    optimum-graphcore puts the embedding.
    """
    ipu_of_layer = iter(layer_ipus(layers_per_ipu, count_layers(blocks, layer_lists)))
    groups: list[list[str]] = [[] for _ in layers_per_ipu]
    ipu = 0
    for block in blocks:
        ipus = {next(ipu_of_layer) for _ in block_layers(block, layer_lists)}
        if len(ipus) > 1:
            raise IPUError(f"layers_per_ipu {list(layers_per_ipu)} splits block {block.name!r} over IPUs "
                           f"{sorted(ipus)}: plan with one layer per block (granularity 1)")
        ipu = ipus.pop() if ipus else ipu
        groups[ipu].append(block.name)
    for index, group in enumerate(groups):
        if not group:
            raise IPUError(f"layers_per_ipu {list(layers_per_ipu)} leaves IPU {index} without blocks: "
                           f"give it layers or use fewer IPUs")
    return [tuple(group) for group in groups]


def recompute_blocks(blocks: Sequence[Block], layer_lists: Sequence[str]) -> list[str]:
    """Blocks whose outputs optimum-graphcore checkpoints: every layer but the last of each layer list."""
    last = {}
    for block in blocks:
        for layer in block_layers(block, layer_lists):
            last[layer.rpartition(".")[0]] = block.name
    return [block.name for block in blocks
            if block_layers(block, layer_lists) and block.name not in last.values()]


def ipu_layer_counts(placed: Sequence[tuple[Block, int]], layer_lists: Sequence[str], ipus: int) -> list[int] | str:
    """The layers on each IPU, given each block's IPU; or, where a layer's sub-layers are on several IPUs (a
    sub-layer plan), why ``layers_per_ipu`` cannot say it (optimum-graphcore places whole layers)."""
    ipus_of: dict[str, set[int]] = {}
    for block, ipu in placed:
        for module in block.modules:
            layer = layer_of(module, layer_lists)
            if layer is not None:
                ipus_of.setdefault(layer, set()).add(ipu)
    counts = [0] * ipus
    for layer, found in ipus_of.items():
        if len(found) > 1:
            return (f"none (the plan splits layer {layer} over IPUs {', '.join(map(str, sorted(found)))}; "
                    f"optimum-graphcore places whole layers)")
        counts[found.pop()] += 1
    return counts
