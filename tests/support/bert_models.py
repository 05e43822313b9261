"""Tiny BERT and RoBERTa configurations and inputs for the model tests (seeded, no downloads).

Both families are the same encoder (RoBERTa's modeling file is BERT's with its own embeddings and
LM head), so one description serves both: :func:`encoder_family` builds either's ``Family``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import BertConfig  # noqa: E402
from transformers.models.bert import modeling_bert as stock  # noqa: E402

from common.versions import VersionRange  # noqa: E402
from families.layout import generated_package  # noqa: E402
from support.model_checks import Family, Inputs  # noqa: E402

VOCAB, POSITIONS, HIDDEN = 50, 40, 16
# 1-3 layers, tied and untied heads, gelu and relu, relative positions, and a decoder with cross-attention
# (last: the tracing tests use the second and the last configuration).  A chunked feed-forward does not
# trace with fx (test_bert.py checks it eagerly).
CONFIGS: dict[str, dict[str, Any]] = {  # config name -> the config class's keyword arguments
    "1layer-tied": dict(num_hidden_layers=1),
    "2layer-untied-relu": dict(num_hidden_layers=2, tie_word_embeddings=False, hidden_act="relu"),
    "2layer-relative-key-query": dict(num_hidden_layers=2, position_embedding_type="relative_key_query"),
    "3layer-decoder-cross-attention": dict(num_hidden_layers=3, is_decoder=True, add_cross_attention=True),
}
CROSS = "cross-attention"  # configurations whose base model takes an encoder's hidden states


def config_factory(config_class: type, common: dict[str, Any]) -> Callable[[str], Any]:
    def config(name: str) -> Any:
        made = config_class(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=2, intermediate_size=24,
                            max_position_embeddings=POSITIONS, hidden_dropout_prob=0.1,
                            attention_probs_dropout_prob=0.1, **common, **CONFIGS[name])
        if hasattr(made, "_attn_implementation"):  # 4.36 on: stock with eager attention, what ours computes
            made._attn_implementation = "eager"
        return made
    return config


config = config_factory(BertConfig, {})


def inputs(masks: bool, batch: int = 2, sequence: int = 7, seed: int = 1, cross: bool = False,
           low: int = 0, pad: int | None = None) -> Inputs:
    """Every input a path may take; ``cross``: an encoder's hidden states; ``pad``: ids of padded positions."""
    generator = torch.Generator().manual_seed(seed)
    values = {"input_ids": torch.randint(low, VOCAB, (batch, sequence), generator=generator),
              "token_type_ids": torch.randint(0, 2, (batch, sequence), generator=generator),
              "position_ids": torch.arange(sequence).flip(0).expand(batch, -1).contiguous(),
              "labels": torch.randint(0, VOCAB, (batch, sequence), generator=generator),
              "next_sentence_label": torch.randint(0, 2, (batch,), generator=generator)}
    values["labels"][0, :3] = -100  # positions the masked-LM loss ignores
    if masks:
        attention = torch.ones(batch, sequence, dtype=torch.long)
        attention[1, -2:] = 0  # right padding, as BERT batches are padded
        values["attention_mask"] = attention
        if pad is not None:
            values["input_ids"][1, -2:] = pad
    if cross:
        values["encoder_hidden_states"] = torch.randn(batch, 5, HIDDEN, generator=generator)
        encoder_mask = torch.ones(batch, 5, dtype=torch.long)
        encoder_mask[0, -1] = 0
        values["encoder_attention_mask"] = encoder_mask
    return values


def call_kwargs_for(base: str) -> Callable[[str, Inputs, str], Inputs]:
    """Arguments for one forward path of the family whose base model class is ``base``."""
    def call_kwargs(class_name: str, values: Inputs, path: str) -> Inputs:
        """'hidden'/'logits' (no labels), 'labels' (every label the class takes), 'labels-only' (the masked-LM
        labels without the next-sentence label), 'token-types' (with token type and position ids, and labels)."""
        keep = {"input_ids", "attention_mask"}
        if class_name == base:
            keep |= {"encoder_hidden_states", "encoder_attention_mask"}
        if path == "token-types":
            keep |= {"token_type_ids", "position_ids"}
        if class_name != base and path in ("labels", "labels-only", "token-types"):
            keep.add("labels")
            if class_name.endswith("ForPreTraining") and path != "labels-only":
                keep.add("next_sentence_label")
        return {k: v for k, v in values.items() if k in keep}
    return call_kwargs


def reference_output(class_name: str, output: Any, kwargs: Inputs) -> torch.Tensor:
    """The one value the generated model returns, read off the stock ModelOutput."""
    if class_name.endswith("ForPreTraining"):
        labelled = "labels" in kwargs and "next_sentence_label" in kwargs
        return output.loss if labelled else output.prediction_logits
    if class_name.endswith("ForMaskedLM"):
        return output.loss if "labels" in kwargs else output.logits
    return output.last_hidden_state


TRAIN_SEQUENCE = 7


def train_batch_for(low: int, pad: int, keys: tuple[str, ...]) -> Callable[[Any, int, int], Inputs]:
    """Training batches of the default class, which takes ``keys`` (its recipe's [pipeline.inputs])."""
    def train_batch(cfg: Any, size: int, seed: int) -> Inputs:
        """A training batch of the default class: right padding in every other sequence, ignored labels."""
        values = inputs(True, size, TRAIN_SEQUENCE, seed, low=low)
        values["attention_mask"] = torch.ones(size, TRAIN_SEQUENCE, dtype=torch.long)
        values["attention_mask"][1::2, -2:] = 0
        values["input_ids"][1::2, -2:] = pad
        values["labels"][::3, :2] = -100
        return {k: values[k] for k in keys}
    return train_batch


def encoder_family(name: str, stock_module: ModuleType, generated_module: ModuleType, make_config: Callable[[str], Any],
                   prefix: str, heads: tuple[str, ...], low: int, pad: int, train_inputs: tuple[str, ...],
                   release: str = "4.5.1") -> Family:
    """BERT or RoBERTa as the model tests see it: ``prefix``Model and its ``heads``; ids from ``low``; the default
    class trains on ``train_inputs``."""
    base = f"{prefix}Model"
    paths: dict[str, tuple[str, ...]] = {base: ("hidden", "token-types")}
    for head in heads:
        paths[head] = ("labels", "labels-only", "logits", "token-types") if head.endswith("ForPreTraining") \
            else ("labels", "logits", "token-types")

    def family_inputs(masks: bool, batch: int = 2, seed: int = 1, sequence: int = 7, config_name: str = "") -> Inputs:
        return inputs(masks, batch, sequence, seed, cross=CROSS in config_name, low=low, pad=pad)

    return Family(name, release, stock_module, generated_module, make_config, tuple(CONFIGS), paths, family_inputs,
                  call_kwargs_for(base), reference_output, lengths={"sequence": 9},
                  train_batch=train_batch_for(low, pad, train_inputs), train_lengths={"sequence": TRAIN_SEQUENCE},
                  embedded_inputs=("input_ids",))


# The classifier heads' configurations: each problem type stock chooses, with labels of its dtype and shape
# (tests/transforms/test_classification_loss.py covers int32 labels, which cross-entropy refuses).
PROBLEMS: dict[str, tuple[int, str | None]] = {  # config name -> (num_labels, config.problem_type)
    "regression": (1, None), "regression-3": (3, "regression"), "single-label": (3, None), "multi-label": (3, None)}
# Before problem_type (4.6) the loss follows num_labels alone: regression for one label, else single-label.
PROBLEM_TYPE = VersionRange.parse(">=4.6")


def heads_families(name: str, stock_module: ModuleType, generated_module: ModuleType,
                   make_config: Callable[[str], Any], prefix: str, low: int, pad: int, release: str) -> list[Family]:
    """``prefix``ForSequenceClassification for every problem type, ``prefix``ForTokenClassification single-label."""
    def head_config(config_name: str) -> Any:
        cfg = make_config("2layer-untied-relu")
        cfg.num_labels, cfg.problem_type = PROBLEMS[config_name]
        return cfg

    def head_inputs(masks: bool, batch: int = 2, seed: int = 1, sequence: int = 7, config_name: str = "") -> Inputs:
        values = inputs(masks, batch, sequence, seed, low=low, pad=pad)
        generator = torch.Generator().manual_seed(seed + 1)
        num_labels, _ = PROBLEMS[config_name]
        values["labels"] = {"regression": lambda: torch.randn(batch, generator=generator),
                            "regression-3": lambda: torch.randn(batch, 3, generator=generator),
                            "single-label": lambda: torch.randint(0, 3, (batch,), generator=generator),
                            "multi-label": lambda: torch.randint(0, 2, (batch, 3), generator=generator).float(),
                            }[config_name]()
        values["token_labels"] = torch.randint(0, num_labels, (batch, sequence), generator=generator)
        values["token_labels"][0, :2] = -100  # positions the loss ignores
        return values

    def head_kwargs(class_name: str, values: Inputs, path: str) -> Inputs:
        kwargs: Inputs = {k: values[k] for k in ("input_ids", "attention_mask") if k in values}
        if path == "labels":
            kwargs["labels"] = values["token_labels" if class_name.endswith("TokenClassification") else "labels"]
        return kwargs

    def head_output(class_name: str, output: Any, kwargs: Inputs) -> torch.Tensor:
        return output.loss if "labels" in kwargs else output.logits

    def family(class_name: str, configs: tuple[str, ...]) -> Family:
        return Family(name, release, stock_module, generated_module, head_config, configs,
                      {class_name: ("labels", "logits")}, head_inputs, head_kwargs, head_output,
                      lengths={"sequence": 9}, embedded_inputs=("input_ids",))

    problems = tuple(PROBLEMS) if release in PROBLEM_TYPE else ("regression", "single-label")
    return [family(f"{prefix}ForSequenceClassification", problems),
            family(f"{prefix}ForTokenClassification", ("single-label",))]


TRAIN_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label")


def family_at(release: str) -> Family:
    """BERT at ``release``: the stock modeling module this process imports against the package of that release."""
    generated = importlib.import_module(f"{generated_package('bert', release)}.modeling_bert")
    return encoder_family("bert", stock, generated, config, "Bert", ("BertForMaskedLM", "BertForPreTraining"), low=1,
                          pad=0, train_inputs=TRAIN_INPUTS, release=release)


def families_at(release: str) -> list[Family]:
    """BERT's base model and pre-training heads, and its classifier heads, at ``release``."""
    base = family_at(release)
    return [base, *heads_families("bert", stock, base.generated, config, "Bert", 1, 0, release)]


def __getattr__(name: str) -> Any:
    """``BERT`` and ``generated`` (4.5.1, the release installed in .venv) are built on first use, so that a
    worker running another release imports this module without importing the 4.5.1 package."""
    if name == "BERT":
        return family_at("4.5.1")
    if name == "generated":
        return family_at("4.5.1").generated
    raise AttributeError(name)
