"""Tiny T5 configurations, inputs and call paths: torch only, no transformers import.

Shared by the in-process model tests (``t5_models``, against the transformers in .venv) and the
per-release worker (``t5_release_worker``, which runs against another release's install).
"""

from __future__ import annotations

import torch

CLASSES = ("T5ForConditionalGeneration", "T5Model", "T5EncoderModel")
PATHS = {"T5ForConditionalGeneration": ("labels", "labels-only", "logits"),
         "T5Model": ("hidden",), "T5EncoderModel": ("hidden",)}

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
TRAIN_SOURCE, TRAIN_TARGET = 7, 5  # the sequence lengths of a training batch (model_families.t5_train_batch)
COMMON = dict(vocab_size=48, d_model=16, d_kv=4, d_ff=24, num_heads=2, relative_attention_num_buckets=8,
              dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0)


def config_kwargs(name: str) -> dict:
    """``T5Config`` keyword arguments of the named configuration."""
    return {**COMMON, **CONFIGS[name]}


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
