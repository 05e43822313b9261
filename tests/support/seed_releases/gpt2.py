"""GPT-2 at a release: the 4.5.1 test family's configs and paths, and GPT2ForSequenceClassification with a config
per loss stock can choose, against the release's stock and package."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from common.versions import VersionRange
from support import gpt2_models
from support.gpt2_models import VOCAB, family_at
from support.model_checks import Family, Inputs

HEAD = "GPT2ForSequenceClassification"
PAD = 0
LABELS = 3
# config name -> (num_labels, problem_type preset, the labels' kind). Stock chooses the loss on the first call
# with labels: num_labels == 1 is regression; else integer labels are single-label, float ones multi-label;
# a preset problem_type wins (regression over 3 outputs). The last config is the one fx and export trace.
PROBLEMS: dict[str, tuple[int, str | None, str]] = {
    "regression": (1, None, "float"),
    "regression-3": (LABELS, "regression", "float-rows"),
    "multi-label": (LABELS, None, "multi-hot"),
    "single-label": (LABELS, None, "class"),
}
# Until 4.10 stock has no problem_type: regression when num_labels == 1, else cross-entropy.
BEFORE_PROBLEM_TYPE = ("regression", "single-label")


def eager(make_config: Callable[[str], Any]) -> Callable[[str], Any]:
    """Configs whose stock models compute what the generated ones do: the eager attention where the release offers
    several (sdpa is 4.46's default), and no key/value cache (the generated models have none; from 4.57 stock
    builds one by default, and with it never reads packed sequences from position ids without a mask)."""
    def make(name: str) -> Any:
        config = make_config(name)
        if hasattr(config, "_attn_implementation"):
            config._attn_implementation = "eager"
        config.use_cache = False
        return config
    return make


def head_config(name: str) -> Any:
    num_labels, problem_type, _ = PROBLEMS[name]
    config = gpt2_models.config("2layer-untied")
    config.num_labels, config.pad_token_id = num_labels, PAD
    if problem_type is not None:
        config.problem_type = problem_type
    return eager(lambda _: config)(name)


def head_inputs(masks: bool, batch: int = 2, seed: int = 1, sequence: int = 7, config_name: str = "") -> Inputs:
    """Right-padded ids (the head reads each row's last non-pad token) and labels of the config's kind."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(PAD + 1, VOCAB, (batch, sequence), generator=generator)
    ids[1, -2:] = PAD
    values = {"input_ids": ids}
    if masks:
        values["attention_mask"] = (ids != PAD).long()
    kind = PROBLEMS[config_name][2]
    if kind == "class":
        values["labels"] = torch.randint(0, LABELS, (batch,), generator=generator)
    elif kind == "multi-hot":
        values["labels"] = torch.randint(0, 2, (batch, LABELS), generator=generator).float()
    elif kind == "float-rows":
        values["labels"] = torch.randn(batch, LABELS, generator=generator)
    else:
        values["labels"] = torch.randn(batch, generator=generator)
    return values


def head_kwargs(class_name: str, values: Inputs, path: str) -> Inputs:
    """'labels': the loss; 'logits': the pooled logits (no labels)."""
    return {k: v for k, v in values.items() if path == "labels" or k != "labels"}


def head_output(class_name: str, output: Any, kwargs: Inputs) -> torch.Tensor:
    return output.loss if "labels" in kwargs else output.logits


def head_at(release: str) -> Family:
    base = family_at(release)
    configs = tuple(PROBLEMS) if release in VersionRange.parse(">=4.11") else BEFORE_PROBLEM_TYPE
    return Family("gpt2", release, base.stock, base.generated, head_config, configs, {HEAD: ("labels", "logits")},
                  head_inputs, head_kwargs, head_output, lengths={"sequence": 9})


def families(release: str) -> list[Family]:
    base = family_at(release)
    return [dataclasses.replace(base, make_config=eager(base.make_config)), head_at(release)]
