"""Tiny BART configurations and inputs for the model tests (seeded, no downloads)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import BartConfig  # noqa: E402
from transformers.models.bart import modeling_bart as stock  # noqa: E402

from common.versions import VersionRange  # noqa: E402
from families.layout import generated_package  # noqa: E402
from support.model_checks import Family, Inputs  # noqa: E402

VOCAB, POSITIONS = 48, 40
# 1-3 layers per stack, tied and untied LM head, gelu and relu, scaled embeddings, dropout 0.1 everywhere.
# Layer drop stays 0 here (the generic tests seed torch only); tests/test_bart_layerdrop.py sets it.
CONFIGS: dict[str, dict[str, Any]] = {  # config name -> the config class's keyword arguments
    "1layer-tied": dict(encoder_layers=1, decoder_layers=1),
    "2layer-untied": dict(encoder_layers=2, decoder_layers=2, tie_word_embeddings=False),
    "3layer-tied-relu-2dec": dict(encoder_layers=3, decoder_layers=2, activation_function="relu"),
    "2layer-scaled-3dec": dict(encoder_layers=2, decoder_layers=3, scale_embedding=True),
}
# BartModel makes its decoder input by shifting input_ids right when it is given none ("shifted").
PATHS = {"BartForConditionalGeneration": ("labels", "labels-only", "logits"), "BartModel": ("shifted", "hidden")}


def config(name: str, **overrides: Any) -> BartConfig:
    values = dict(vocab_size=VOCAB, max_position_embeddings=POSITIONS, d_model=16, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=24, decoder_ffn_dim=20, dropout=0.1,
                  attention_dropout=0.1, activation_dropout=0.1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                  decoder_start_token_id=2)
    return BartConfig(**{**values, **CONFIGS[name], **overrides})


def inputs(masks: bool, batch: int = 2, source: int = 7, target: int = 5, seed: int = 1) -> Inputs:
    """Every input a path may take: ids from 3 (0-2 are <s>, <pad>, </s>), labels with ignored positions."""
    generator = torch.Generator().manual_seed(seed)
    values = {"input_ids": torch.randint(3, VOCAB, (batch, source), generator=generator),
              "decoder_input_ids": torch.randint(3, VOCAB, (batch, target), generator=generator),
              "labels": torch.randint(3, VOCAB, (batch, target), generator=generator)}
    values["labels"][0, -2:] = -100  # ignored, and replaced by the pad id in the shifted decoder input
    if masks:
        attention = torch.ones(batch, source, dtype=torch.long)
        attention[1, -3:] = 0
        decoder = torch.ones(batch, target, dtype=torch.long)
        decoder[0, -1] = 0
        values["attention_mask"], values["decoder_attention_mask"] = attention, decoder
    return values


def call_kwargs(class_name: str, values: Inputs, path: str) -> Inputs:
    """Arguments for one forward path: 'labels' (the loss), 'labels-only' (decoder input shifted from the
    labels), 'logits', 'hidden', 'shifted' (BartModel's decoder input shifted from input_ids)."""
    keep = {"input_ids", "attention_mask"}
    if path not in ("labels-only", "shifted"):
        keep |= {"decoder_input_ids", "decoder_attention_mask"}
    if path in ("labels", "labels-only"):
        keep.add("labels")
    return {k: v for k, v in values.items() if k in keep}


def reference_output(class_name: str, output: Any, kwargs: Inputs) -> torch.Tensor:
    """The one value the generated model returns, read off the stock ModelOutput."""
    if class_name == "BartForConditionalGeneration":
        return output.loss if "labels" in kwargs else output.logits
    return output.last_hidden_state


def family_inputs(masks: bool, batch: int = 2, seed: int = 1, source: int = 7, target: int = 5,
                  config_name: str = "") -> Inputs:
    return inputs(masks, batch, source, target, seed)


TRAIN_SOURCE, TRAIN_TARGET = 7, 5


def train_batch(cfg: BartConfig, size: int, seed: int) -> Inputs:
    """A BartForConditionalGeneration training batch: padding in both masks, some ignored labels."""
    vocab = cfg.vocab_size
    generator = torch.Generator().manual_seed(seed)
    values = {"input_ids": torch.randint(3, vocab, (size, TRAIN_SOURCE), generator=generator),
              "attention_mask": torch.ones(size, TRAIN_SOURCE, dtype=torch.long),
              "decoder_input_ids": torch.randint(3, vocab, (size, TRAIN_TARGET), generator=generator),
              "decoder_attention_mask": torch.ones(size, TRAIN_TARGET, dtype=torch.long),
              "labels": torch.randint(3, vocab, (size, TRAIN_TARGET), generator=generator)}
    values["attention_mask"][1::2, -2:] = 0  # padding in every other sequence
    values["decoder_attention_mask"][::2, -1] = 0
    values["labels"][::3, -2:] = -100  # ignored positions
    return values


# Later releases also check the sequence classifier, its labels chosen by config so that every loss stock
# picks from num_labels, config.problem_type and the labels' dtype is taken (4.15 on; before, num_labels only):
# regression (num_labels 1), regression preset over 3 outputs, multi-label from multi-hot labels, single-label.
HEAD = "BartForSequenceClassification"
HEAD_LOSS = {"1layer-tied": "regression", "2layer-untied": "regression-3", "3layer-tied-relu-2dec": "multi",
             "2layer-scaled-3dec": "single"}
PROBLEM_TYPE = VersionRange.parse(">=4.15")  # 4.10.3 has none; 4.15.0 has it


def head_config_at(release: str) -> Callable[[str], BartConfig]:
    """The classifier's config for each name: its labels (HEAD_LOSS) and eager attention, what the conversion
    keeps (stock's default is sdpa from 4.36; earlier releases keep the keyword as an unused attribute)."""
    def head_config(name: str) -> BartConfig:
        preset = {"problem_type": "regression"} if HEAD_LOSS[name] == "regression-3" and release in PROBLEM_TYPE \
            else {}
        return config(name, num_labels=1 if HEAD_LOSS[name] == "regression" else 3, attn_implementation="eager",
                      **preset)
    return head_config


def head_labels(release: str, config_name: str, batch: int, seed: int) -> torch.Tensor:
    """The labels of one problem type: floats (regression), float rows (the preset regression over 3 outputs),
    class indices, or multi-hot floats; class indices for the last two before 4.15."""
    generator = torch.Generator().manual_seed(seed + 100)
    loss = HEAD_LOSS[config_name]
    if loss == "regression":
        return torch.randn(batch, generator=generator)
    if loss == "multi" and release in PROBLEM_TYPE:
        return torch.randint(0, 2, (batch, 3), generator=generator).float()
    if loss == "regression-3" and release in PROBLEM_TYPE:
        return torch.randn(batch, 3, generator=generator)
    return torch.randint(0, 3, (batch,), generator=generator)


def family_at(release: str) -> Family:
    """BART at ``release``: the stock modeling module this process imports (the release's install on PYTHONPATH)
    against the package generated for that release; after 4.5.1 with the sequence classifier."""
    generated = importlib.import_module(f"{generated_package('bart', release)}.modeling_bart")
    if release == "4.5.1":  # tests/models and tests/models/test_heads.py check it
        return Family("bart", release, stock, generated, config, tuple(CONFIGS), PATHS, family_inputs, call_kwargs,
                      reference_output, lengths={"source": 9, "target": 4}, train_batch=train_batch,
                      train_lengths={"source": TRAIN_SOURCE, "target": TRAIN_TARGET})

    def release_inputs(masks: bool, batch: int = 2, seed: int = 1, source: int = 7, target: int = 5,
                       config_name: str = "") -> Inputs:
        values = inputs(masks, batch, source, target, seed)
        values["head_labels"] = head_labels(release, config_name or tuple(CONFIGS)[-1], batch, seed)
        return values

    def release_kwargs(class_name: str, values: Inputs, path: str) -> Inputs:
        if class_name != HEAD:
            return call_kwargs(class_name, {k: v for k, v in values.items() if k != "head_labels"}, path)
        ids = values["input_ids"].clone()
        ids[:, -1] = 2  # </s>, whose hidden state the head classifies
        kwargs = {"input_ids": ids, **({"attention_mask": values["attention_mask"]} if "attention_mask" in values
                                       else {})}
        return {**kwargs, "labels": values["head_labels"]} if path == "labels" else kwargs

    def release_output(class_name: str, output: Any, kwargs: Inputs) -> torch.Tensor:
        if class_name == HEAD:
            return output.loss if "labels" in kwargs else output.logits
        return reference_output(class_name, output, kwargs)

    return Family("bart", release, stock, generated, head_config_at(release), tuple(CONFIGS),
                  {**PATHS, HEAD: ("labels", "logits")}, release_inputs, release_kwargs, release_output,
                  lengths={"source": 9, "target": 4},
                  train_batch=train_batch, train_lengths={"source": TRAIN_SOURCE, "target": TRAIN_TARGET})


def __getattr__(name: str) -> Any:
    """``BART`` and ``generated`` (4.5.1, the release installed in .venv) are built on first use, so that a
    worker running another release imports this module without importing the 4.5.1 package."""
    if name == "BART":
        return family_at("4.5.1")
    if name == "generated":
        return family_at("4.5.1").generated
    raise AttributeError(name)
