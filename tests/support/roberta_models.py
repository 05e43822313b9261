"""Tiny RoBERTa configurations and inputs for the model tests: BERT's (bert_models.py), RoBERTa's classes and ids.

Ids are drawn from 3 up (0-2: <s>, <pad>, </s>) and padded positions hold the pad id 1, so position
ids made from the input ids (create_position_ids_from_input_ids) differ from a plain range.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
from transformers import RobertaConfig  # noqa: E402
from transformers.models.roberta import modeling_roberta as stock  # noqa: E402

from families.layout import generated_package  # noqa: E402
from support.bert_models import config_factory, encoder_family, heads_families  # noqa: E402
from support.model_checks import Family  # noqa: E402

PAD = 1
config = config_factory(RobertaConfig, dict(pad_token_id=PAD, bos_token_id=0, eos_token_id=2))



def family_at(release: str) -> Family:
    """RoBERTa at ``release``: the stock modeling module this process imports against the package of that release."""
    generated = importlib.import_module(f"{generated_package('roberta', release)}.modeling_roberta")
    return encoder_family("roberta", stock, generated, config, "Roberta", ("RobertaForMaskedLM",), low=3, pad=PAD,
                          train_inputs=("input_ids", "attention_mask", "labels"), release=release)


def families_at(release: str) -> list[Family]:
    """RoBERTa's base model and masked-LM head, and its classifier heads, at ``release``."""
    base = family_at(release)
    return [base, *heads_families("roberta", stock, base.generated, config, "Roberta", 3, PAD, release)]


def __getattr__(name: str) -> Any:
    """``ROBERTA`` (4.5.1, the release installed in .venv) is built on first use, so that a worker running another
    release imports this module without importing the 4.5.1 package."""
    if name == "ROBERTA":
        return family_at("4.5.1")
    raise AttributeError(name)
