"""Tiny RoBERTa configurations and inputs for the model tests: BERT's (bert_models.py), RoBERTa's classes and ids.

Ids are drawn from 3 up (0-2: <s>, <pad>, </s>) and padded positions hold the pad id 1, so position
ids made from the input ids (create_position_ids_from_input_ids) differ from a plain range.
"""

from __future__ import annotations

import importlib

import pytest

transformers = pytest.importorskip("transformers")
from transformers import RobertaConfig  # noqa: E402
from transformers.models.roberta import modeling_roberta as stock  # noqa: E402

from support.bert_models import config_factory, encoder_family  # noqa: E402

generated = importlib.import_module("generated_models.roberta.v4_5_1.modeling_roberta")

PAD = 1
config = config_factory(RobertaConfig, dict(pad_token_id=PAD, bos_token_id=0, eos_token_id=2))

ROBERTA = encoder_family("roberta", stock, generated, config, "Roberta", ("RobertaForMaskedLM",), low=3, pad=PAD,
                         train_inputs=("input_ids", "attention_mask", "labels"))
