"""Tiny T5 configurations and inputs shared by the model tests (seeded, no downloads)."""

from __future__ import annotations

import importlib

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import T5Config  # noqa: E402
from transformers.models.t5 import modeling_t5 as stock  # noqa: E402

from partitioning.family import ModelFamily  # noqa: E402
from partitioning.ipu.roles import Roles, roles_for  # noqa: E402

generated = importlib.import_module("generated_models.t5.v4_5_1.modeling_t5")
T5 = ModelFamily.load("t5", "4.5.1")  # the partitioner's view of T5, read from converter/recipe_data/t5.toml

CLASSES = ("T5ForConditionalGeneration", "T5Model", "T5EncoderModel")

# 1-3 layers, relu and gated-gelu feed-forward, tied and untied embeddings, dropout 0.1.
CONFIGS = {
    "1layer-relu-tied": dict(num_layers=1, num_decoder_layers=1, feed_forward_proj="relu",
                             tie_word_embeddings=True),
    "2layer-gelu-untied": dict(num_layers=2, num_decoder_layers=2, feed_forward_proj="gated-gelu",
                               tie_word_embeddings=False),
    "3layer-relu-untied-2dec": dict(num_layers=3, num_decoder_layers=2, feed_forward_proj="relu",
                                    tie_word_embeddings=False),
    "2layer-gelu-tied": dict(num_layers=2, num_decoder_layers=3, feed_forward_proj="gated-gelu",
                             tie_word_embeddings=True),
}


def config(name: str) -> T5Config:
    return T5Config(vocab_size=48, d_model=16, d_kv=4, d_ff=24, num_heads=2, relative_attention_num_buckets=8,
                    dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0, **CONFIGS[name])


def t5_roles(tied: bool, stateless: bool) -> Roles:
    """The IPU roles of T5ForConditionalGeneration, as partition-model derives them from the recipe."""
    return roles_for("t5", "T5ForConditionalGeneration", {"tie_word_embeddings": tied}, stateless)


def pair(class_name: str, config_name: str, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The stock and the generated model holding the same weights."""
    cfg = config(config_name)
    torch.manual_seed(seed)
    reference = getattr(stock, class_name)(cfg)
    converted = getattr(generated, class_name)(cfg)
    converted.load_state_dict(reference.state_dict(), strict=True)
    return reference, converted


def inputs(masks: bool, batch: int = 2, source: int = 7, target: int = 5, seed: int = 1) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    values = {
        "input_ids": torch.randint(1, 48, (batch, source), generator=generator),
        "decoder_input_ids": torch.randint(1, 48, (batch, target), generator=generator),
        "labels": torch.randint(1, 48, (batch, target), generator=generator),
    }
    values["labels"][0, -2:] = -100  # ignored positions, replaced by pad in the shifted decoder input
    if masks:
        attention = torch.ones(batch, source, dtype=torch.long)
        attention[1, -3:] = 0
        decoder = torch.ones(batch, target, dtype=torch.long)
        decoder[0, -1] = 0
        values["attention_mask"], values["decoder_attention_mask"] = attention, decoder
    return values


def call_kwargs(class_name: str, values: dict[str, torch.Tensor], path: str) -> dict[str, torch.Tensor]:
    """Arguments for one forward path: 'labels', 'labels-only' (shift right), 'logits'."""
    keep = {"input_ids", "attention_mask"}
    if class_name != "T5EncoderModel":
        keep |= {"decoder_attention_mask"}
        if path != "labels-only":
            keep.add("decoder_input_ids")
    if class_name == "T5ForConditionalGeneration" and path in ("labels", "labels-only"):
        keep.add("labels")
    return {k: v for k, v in values.items() if k in keep}


def reference_output(class_name: str, output, kwargs) -> torch.Tensor:
    """The one value the generated model returns, read off the stock ModelOutput."""
    if class_name == "T5ForConditionalGeneration":
        return output.loss if "labels" in kwargs else output.logits
    return output.last_hidden_state
