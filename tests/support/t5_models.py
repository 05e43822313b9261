"""Stock transformers (the release in .venv) and generated T5 models on the tiny configurations of t5_cases."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch

from support.t5_cases import CLASSES, CONFIGS, call_kwargs, config_kwargs, inputs, reference_output

transformers = pytest.importorskip("transformers")
from transformers import T5Config  # noqa: E402
from transformers.models.t5 import modeling_t5 as stock  # noqa: E402

from families.family import ModelFamily  # noqa: E402
from partitioning.ipu.roles import Roles, roles_for  # noqa: E402

generated = importlib.import_module("generated_models.t5.v4_5_1.modeling_t5")
T5 = ModelFamily.load("t5", "4.5.1")  # the partitioner's view of T5, read from families/recipe_data/t5.toml

__all__ = ["CLASSES", "CONFIGS", "call_kwargs", "config", "generated", "inputs", "pair", "reference_output", "stock"]


def config(name: str) -> T5Config:
    return T5Config(**config_kwargs(name))


def t5_roles(tied: bool, stateless: bool) -> Roles:
    """The IPU roles of T5ForConditionalGeneration, as partition-model derives them from the recipe."""
    return roles_for("t5", "T5ForConditionalGeneration", {"tie_word_embeddings": tied}, stateless)


def pair(class_name: str, config_name: str, seed: int = 0) -> tuple[Any, Any]:
    """The stock and the generated model holding the same weights.

    Typed Any: mypy sees neither a transformers model's attributes nor a generated one's (imported by name).
    """
    cfg = config(config_name)
    torch.manual_seed(seed)
    reference = getattr(stock, class_name)(cfg)
    converted = getattr(generated, class_name)(cfg)
    converted.load_state_dict(reference.state_dict(), strict=True)
    return reference, converted
