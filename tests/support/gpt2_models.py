"""Tiny GPT-2 configurations and inputs for the model tests (seeded, no downloads)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import GPT2Config  # noqa: E402
from transformers.models.gpt2 import modeling_gpt2 as stock  # noqa: E402

from families.layout import generated_package  # noqa: E402
from support.model_checks import Family, Inputs  # noqa: E402

VOCAB, POSITIONS = 50, 32
# 1-3 layers, tied and untied LM head, gelu_new and relu, cross-attention, dropout 0.1 everywhere.
CONFIGS: dict[str, dict[str, Any]] = {  # config name -> the config class's keyword arguments
    "1layer-tied": dict(n_layer=1),
    "2layer-untied": dict(n_layer=2, tie_word_embeddings=False),
    "3layer-tied-relu-inner": dict(n_layer=3, activation_function="relu", n_inner=24),
    "2layer-cross-attention": dict(n_layer=2, add_cross_attention=True),
}
PATHS = {"GPT2LMHeadModel": ("labels", "logits", "token-types"), "GPT2Model": ("hidden", "token-types")}


def config(name: str) -> GPT2Config:
    return GPT2Config(vocab_size=VOCAB, n_positions=POSITIONS, n_ctx=POSITIONS, n_embd=16, n_head=2,
                      resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, **CONFIGS[name])


def inputs(masks: bool, batch: int = 2, sequence: int = 7, seed: int = 1, cross: bool = False) -> Inputs:
    """Every input a path may take; ``cross``: an encoder's hidden states for cross-attention too."""
    generator = torch.Generator().manual_seed(seed)
    values = {"input_ids": torch.randint(0, VOCAB, (batch, sequence), generator=generator),
              "token_type_ids": torch.randint(0, 3, (batch, sequence), generator=generator),
              "position_ids": torch.arange(sequence).flip(0).expand(batch, -1).contiguous()}
    values["labels"] = values["input_ids"].clone()
    values["labels"][0, -2:] = -100  # ignored positions
    if masks:
        attention = torch.ones(batch, sequence, dtype=torch.long)
        attention[1, :2] = 0  # left padding, as GPT-2 batches are padded
        values["attention_mask"] = attention
    if cross:
        values["encoder_hidden_states"] = torch.randn(batch, 5, 16, generator=generator)
        # Always given: without it, stock 4.5.1 reads an unbound `device` when position_ids are passed.
        encoder_mask = torch.ones(batch, 5, dtype=torch.long)
        if masks:
            encoder_mask[0, -1] = 0
        values["encoder_attention_mask"] = encoder_mask
    return values


def call_kwargs(class_name: str, values: Inputs, path: str) -> Inputs:
    """Arguments for one forward path: 'labels' (the loss), 'logits', 'hidden', 'token-types' (with
    token type and position ids)."""
    keep = {"input_ids", "attention_mask", "encoder_hidden_states", "encoder_attention_mask"}
    if path == "token-types":
        keep |= {"token_type_ids", "position_ids"}
    if class_name == "GPT2LMHeadModel" and path in ("labels", "token-types"):
        keep.add("labels")
    return {k: v for k, v in values.items() if k in keep}


def reference_output(class_name: str, output: Any, kwargs: Inputs) -> torch.Tensor:
    """The one value the generated model returns, read off the stock ModelOutput."""
    if class_name == "GPT2LMHeadModel":
        return output.loss if "labels" in kwargs else output.logits
    return output.last_hidden_state


def family_inputs(masks: bool, batch: int = 2, seed: int = 1, sequence: int = 7, config_name: str = "") -> Inputs:
    return inputs(masks, batch, sequence, seed, cross="cross" in config_name)


TRAIN_SEQUENCE = 7


def train_batch(cfg: GPT2Config, size: int, seed: int) -> Inputs:
    """A GPT2LMHeadModel training batch: left padding in every other sequence, some ignored labels."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (size, TRAIN_SEQUENCE), generator=generator)
    mask = torch.ones(size, TRAIN_SEQUENCE, dtype=torch.long)
    mask[1::2, :2] = 0
    labels = torch.randint(0, cfg.vocab_size, (size, TRAIN_SEQUENCE), generator=generator)
    labels[::3, -2:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def family_at(release: str) -> Family:
    """GPT-2 at ``release``: the stock modeling module this process imports (the release's install on
    PYTHONPATH) against the package generated for that release."""
    generated = importlib.import_module(f"{generated_package('gpt2', release)}.modeling_gpt2")
    return Family("gpt2", release, stock, generated, config, tuple(CONFIGS), PATHS, family_inputs, call_kwargs,
                  reference_output, lengths={"sequence": 9}, train_batch=train_batch,
                  train_lengths={"sequence": TRAIN_SEQUENCE})


def __getattr__(name: str) -> Any:
    """``GPT2`` and ``generated`` (4.5.1, the release installed in .venv) are built on first use, so that a
    worker running another release imports this module without importing the 4.5.1 package."""
    if name == "GPT2":
        return family_at("4.5.1")
    if name == "generated":
        return family_at("4.5.1").generated
    raise AttributeError(name)
