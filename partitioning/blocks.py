"""The block chain of a generated T5 and its costs for one micro-batch.

Default granularity: the encoder embedding, each encoder ``T5Block``, the
encoder final norm (+dropout), the decoder embedding, each decoder
``T5Block``, the decoder final norm and the LM head with its loss.  A coarser
granularity groups ``layers_per_block`` consecutive ``T5Block`` s into one
block.  Costs are measured by :mod:`partitioning.costing`.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from partitioning.costing import BlockSpec, Chain, cost_chain
from partitioning.plan import PlanError

CLASSES = ("T5ForConditionalGeneration", "T5Model", "T5EncoderModel")


@dataclass(frozen=True)
class MicroBatch:
    batch: int
    source_len: int
    target_len: int

    def __post_init__(self) -> None:
        if min(self.batch, self.source_len, self.target_len) < 1:
            raise PlanError(f"micro-batch sizes must be positive, got {self}")


def generated_module(family: str, version: str) -> ModuleType:
    """The converted modeling file of ``family`` at ``version`` (written by ``convert-model``)."""
    name = f"generated_models.{family}.v{version.replace('.', '_')}.modeling_{family}"
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        raise PlanError(f"no generated model {name} (run: convert-model {family} --version {version})") from None


def build_t5(class_name: str, config: Any, version: str = "4.5.1", device: str | torch.device = "meta"
             ) -> torch.nn.Module:
    """A generated T5 of ``class_name``, in training mode, built directly on ``device``."""
    if class_name not in CLASSES:
        raise PlanError(f"unknown class {class_name!r}; known: {', '.join(CLASSES)}")
    cls = getattr(generated_module("t5", version), class_name)
    with torch.device(device):  # on meta no parameter memory is ever allocated
        return cls(config).train()


def _group(prefix: str, count: int, layers_per_block: int) -> list[BlockSpec]:
    specs = []
    for first in range(0, count, layers_per_block):
        last = min(first + layers_per_block, count) - 1
        name = f"{prefix}.block.{first}" if first == last else f"{prefix}.block.{first}-{last}"
        specs.append(BlockSpec(name, tuple(f"{prefix}.block.{i}" for i in range(first, last + 1))))
    return specs


def _stack(prefix: str, stack: torch.nn.Module, layers_per_block: int) -> list[BlockSpec]:
    # The stack's one dropout runs after the embedding and again after the final norm;
    # it is listed with the embedding, where it first runs (it has no weights).
    return ([BlockSpec(f"{prefix}.embed", (f"{prefix}.embed_tokens", f"{prefix}.dropout"))]
            + _group(prefix, len(stack.block), layers_per_block)
            + [BlockSpec(f"{prefix}.final", (f"{prefix}.final_layer_norm",))])


def t5_block_specs(model: torch.nn.Module, layers_per_block: int = 1) -> list[BlockSpec]:
    if layers_per_block < 1:
        raise PlanError(f"granularity must be at least 1 layer per block, got {layers_per_block}")
    specs = _stack("encoder", model.encoder, layers_per_block)
    if hasattr(model, "decoder"):
        specs += _stack("decoder", model.decoder, layers_per_block)
    if hasattr(model, "lm_head"):
        head = ("lm_head", "loss_fct") if hasattr(model, "loss_fct") else ("lm_head",)
        specs.append(BlockSpec("lm_head", head))
    return specs


def t5_inputs(class_name: str, config: Any, micro_batch: MicroBatch, device: str | torch.device,
              seed: int = 0) -> dict[str, torch.Tensor]:
    """One training micro-batch: ids, padding masks, and labels when the class computes a loss."""
    generator = torch.Generator().manual_seed(seed)

    def ids(length: int) -> torch.Tensor:
        return torch.randint(1, config.vocab_size, (micro_batch.batch, length), generator=generator).to(device)

    def ones(length: int) -> torch.Tensor:
        return torch.ones(micro_batch.batch, length, dtype=torch.long, device=device)

    values = {"input_ids": ids(micro_batch.source_len), "attention_mask": ones(micro_batch.source_len)}
    if class_name != "T5EncoderModel":
        values |= {"decoder_input_ids": ids(micro_batch.target_len),
                   "decoder_attention_mask": ones(micro_batch.target_len)}
    if class_name == "T5ForConditionalGeneration":
        values["labels"] = ids(micro_batch.target_len)
    return values


def t5_chain(class_name: str, config: Any, micro_batch: MicroBatch, layers_per_block: int = 1,
             version: str = "4.5.1", device: str | torch.device = "meta", measure_repeats: int = 0,
             model: torch.nn.Module | None = None) -> Chain:
    """Build (unless given: then on its device) and cost the block chain of a generated T5."""
    if model is None:
        model = build_t5(class_name, config, version, device)
    else:
        device = next(model.parameters()).device
    kwargs = t5_inputs(class_name, config, micro_batch, device)
    absent = {name: None for name in inspect.signature(model.forward).parameters if name not in kwargs}
    return cost_chain(model, t5_block_specs(model, layers_per_block), kwargs, absent, measure_repeats)
