"""Costing a family's block chain: build (or take) the model, cut it into the family's blocks, cost each."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import torch

from families.family import ModelFamily
from families.models import MicroBatch
from partitioning.cost.blocks import chain_specs
from partitioning.cost.costing import BlockSpec, Chain, cost_chain


def block_specs(family: ModelFamily, class_name: str, model: torch.nn.Module, layers_per_block: int = 1,
                sublayers: bool = False) -> list[BlockSpec]:
    return chain_specs(family.definition.entries(family.class_info(class_name).name), model, layers_per_block,
                       sublayers)


def family_chain(family: ModelFamily, class_name: str, config: Any, micro_batch: MicroBatch,
                 layers_per_block: int = 1, device: str | torch.device = "meta", measure_repeats: int = 0,
                 model: torch.nn.Module | None = None, sublayers: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> Chain:
    """Build (unless given: then on its device) and cost the block chain of ``class_name``."""
    if model is None:
        model = family.build(class_name, config, device)
    else:
        device = next(model.parameters()).device
    kwargs = family.inputs(class_name, config, micro_batch, device)
    absent = {name: None for name in inspect.signature(model.forward).parameters if name not in kwargs}
    specs = block_specs(family, class_name, model, layers_per_block, sublayers)
    return cost_chain(model, specs, kwargs, absent, measure_repeats, clock)
