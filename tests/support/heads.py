"""A family whose default class is one of its fine-tuning heads, for the pipelining worker (which trains the
default class): ``bert-seqcls`` (4.5.1, model_families.py) and ``bert-seqcls@RELEASE`` (any committed release,
in a process importing that release)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from families.family import ModelFamily
from support.model_checks import Family, Inputs

SEQUENCE_HEAD = "BertForSequenceClassification"


@dataclass
class HeadFamily(Family):
    """``Family`` with ``head`` as its default class."""

    head: str = ""

    @property
    def model_family(self) -> ModelFamily:
        loaded = ModelFamily.load(self.name, self.version)
        return ModelFamily(dataclasses.replace(loaded.definition, default_class=self.head), self.version)


def sequence_head(base: Family) -> HeadFamily:
    """BertForSequenceClassification on ``base``'s (BERT's) configs: its training batch with one class index per
    sequence as labels."""
    def batch(cfg: Any, size: int, seed: int) -> Inputs:
        assert base.train_batch is not None
        values = base.train_batch(cfg, size, seed)
        generator = torch.Generator().manual_seed(seed)
        labels = torch.randint(0, cfg.num_labels, (size,), generator=generator)
        return {"input_ids": values["input_ids"], "attention_mask": values["attention_mask"],
                "token_type_ids": values["token_type_ids"], "labels": labels}

    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return HeadFamily(**{**fields, "train_batch": batch, "head": SEQUENCE_HEAD})


def head_family_at(name: str, release: str) -> HeadFamily:
    """``bert-seqcls`` at ``release`` (the release this process imports)."""
    if name != "bert-seqcls":
        raise ValueError(f"no head family {name!r} (known: bert-seqcls)")
    from support.bert_models import family_at

    return sequence_head(family_at(release))
