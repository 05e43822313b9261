"""The block chain of a generated model, made from its family's data (no family named here).

A family's chain (:class:`families.definition.ChainEntry`, paths already made
absolute for one class) becomes :class:`~partitioning.cost.costing.BlockSpec` s:
a fixed block when its first module exists in the model, one block per item
of a layer list (``layers_per_block`` consecutive items grouped into one, or
each item's sub-layers as blocks of their own).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from common.errors import UserError
from families.definition import ChainEntry
from partitioning.cost.costing import BlockSpec


def _exists(model: torch.nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:  # missing, or an attribute that is not a module (BERT's pooler None)
        return False
    return True


def chain_specs(entries: Sequence[ChainEntry], model: torch.nn.Module, layers_per_block: int = 1,
                sublayers: bool = False) -> list[BlockSpec]:
    """The blocks of ``model``, in chain order: fixed blocks it has, its layer lists' items (grouped or split)."""
    if layers_per_block < 1:
        raise UserError(f"granularity must be at least 1 layer per block, got {layers_per_block}")
    specs = []
    for entry in entries:
        if entry.layers is None:
            if not _exists(model, entry.modules[0]):
                continue  # this class has no such block (an encoder-only model's decoder)
            missing = [module for module in entry.modules[1:] if not _exists(model, module)]
            if set(missing) - set(entry.optional):
                required = [module for module in missing if module not in entry.optional]
                raise UserError(f"block {entry.name!r}: the model has {entry.modules[0]} but no {required[0]}")
            specs.append(BlockSpec(str(entry.name), tuple(m for m in entry.modules if m not in missing)))
        elif _exists(model, entry.layers):
            count = len(model.get_submodule(entry.layers))  # type: ignore[arg-type]
            items = [f"{entry.layers}.{index}" for index in range(count)]
            if sublayers and entry.sublayers:
                specs += [BlockSpec(f"{item}.{sub[0]}", tuple(f"{item}.{module}" for module in sub))
                          for item in items for sub in entry.sublayers if _exists(model, f"{item}.{sub[0]}")]
                continue
            for first in range(0, count, layers_per_block):
                group = items[first:first + layers_per_block]
                name = group[0] if len(group) == 1 else f"{entry.layers}.{first}-{first + len(group) - 1}"
                specs.append(BlockSpec(name, tuple(group)))
    if not specs:
        raise UserError("the model has none of its family's blocks")
    for entry in entries:
        layers = entry.layers
        if layers is not None and _exists(model, layers) and not len(model.get_submodule(layers)):  # type: ignore[arg-type]
            raise UserError(f"the model's {layers} has no layers: check the config's layer counts")
    return specs
