"""The decoder-only LLMs as the pipelining worker's families (pipelining_worker.py --family NAME@RELEASE).

Imported in a process whose transformers is that release (PYTHONPATH=.venv/transformers/<release> first):
the tiny tied and untied configs of the release tests (llm_models.py: grouped-query attention, rope scaling,
sliding windows where the family has them), and a training batch with padding and ignored labels.
"""

from __future__ import annotations

from typing import Any

import torch

from families.family import ModelFamily
from support.llm_models import Family as Models

SEQUENCE = 7


class LLM:
    """What pipelining_worker.run_case reads of a family: name, configs, the ModelFamily, a training batch."""

    def __init__(self, name: str, release: str) -> None:
        self.name, self.models = name, Models(name, release, None)
        self.model_family = ModelFamily.load(name, release)
        self.train_lengths = {"sequence": SEQUENCE}

    def make_config(self, config_name: str) -> Any:
        return self.models.config(config_name)

    def train_batch(self, cfg: Any, size: int, seed: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        values = {"input_ids": torch.randint(1, cfg.vocab_size, (size, SEQUENCE), generator=generator),
                  "attention_mask": torch.ones(size, SEQUENCE, dtype=torch.long),
                  "labels": torch.randint(1, cfg.vocab_size, (size, SEQUENCE), generator=generator)}
        values["attention_mask"][1::2, :2] = 0  # left padding in every other sequence
        values["labels"][::3, -2:] = -100  # ignored positions
        return values
