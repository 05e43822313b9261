"""The fine-tuning heads as families whose default class is the head, for the pipelining worker (which trains a
family's default class): ``NAME@RELEASE`` (``gpt2-seqcls@4.57.6``, ``roberta-tokcls@5.23.0``) at the release this
process imports (4.5.1: the .venv's transformers; any other: its side-by-side install first on PYTHONPATH).

A head is data (:data:`HEADS`): its class, its base family (``support/<base>_models.py``, whose configs and
training ids it reuses), the kind of its labels and the module holding its own parameters. One batch builder serves
every head: right padding of 0 to 2 positions, varying by row, with the pad id there (as tokenizers pad), one
class index per sequence or per token (-100 on padding, as users mask it), and, for BART, each row's last real
token its </s> (every row as many, which its head requires).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from families.family import ModelFamily
from support.model_checks import Family, Inputs

LABELS = 3  # classes (not the config's default 2: a swapped pair of logits changes the loss)
PADDED = 2  # the most padded positions at the end of a row


@dataclass(frozen=True)
class Head:
    """One head users fine-tune, as data."""

    class_name: str
    base: str  # its family: support/<base>_models.py family_at(release)
    labels: str  # "sequence": one class index per row; "token": one per token
    module: str  # the module holding the head's own parameters (the pipeline's last stage)
    config: str  # the base's config the pipelined case trains
    ends_with_eos: bool = False  # its source must end with </s> (BART classifies its hidden state)
    pad_token_id: int | None = None  # where the base config has none (GPT-2: its head needs one past one row)


# BART's 1layer-tied: transformers 5.x ties BART's encoder and decoder embeddings only when tie_word_embeddings is
# set, and the stateless form the pipeline trains refuses an untied one.
HEADS: dict[str, Head] = {
    "gpt2-seqcls": Head("GPT2ForSequenceClassification", "gpt2", "sequence", "score", "2layer-untied",
                        pad_token_id=0),
    "bert-seqcls": Head("BertForSequenceClassification", "bert", "sequence", "classifier", "2layer-untied-relu"),
    "bert-tokcls": Head("BertForTokenClassification", "bert", "token", "classifier", "2layer-untied-relu"),
    "roberta-seqcls": Head("RobertaForSequenceClassification", "roberta", "sequence", "classifier",
                           "2layer-untied-relu"),
    "roberta-tokcls": Head("RobertaForTokenClassification", "roberta", "token", "classifier", "2layer-untied-relu"),
    "bart-seqcls": Head("BartForSequenceClassification", "bart", "sequence", "classification_head", "1layer-tied",
                        ends_with_eos=True),
}
KEPT = ("input_ids", "attention_mask", "token_type_ids")  # of the base's training batch (labels are the head's)


@dataclass
class HeadFamily(Family):
    """``Family`` with ``head`` as its default class."""

    head: str = ""

    @property
    def model_family(self) -> ModelFamily:
        loaded = ModelFamily.load(self.name, self.version)
        return ModelFamily(dataclasses.replace(loaded.definition, default_class=self.head), self.version)


def head_batch(head: Head, base: Family) -> Callable[[Any, int, int], Inputs]:
    """Training batches of ``head``: the base's ids (its token range), the head's padding and labels."""
    def batch(cfg: Any, size: int, seed: int) -> Inputs:
        assert base.train_batch is not None
        values = {k: v.clone() for k, v in base.train_batch(cfg, size, seed).items() if k in KEPT}
        ids, pad = values["input_ids"], cfg.pad_token_id
        ids[ids == pad] = pad + 1  # ordinary tokens are not the pad (GPT-2's ids start at 0, its head's pad id)
        rows, length = ids.shape
        # 0 to PADDED padded positions per row, in turn from the seed: micro-batches (and steps) differ in where
        # each row ends, which the heads reading positions off the data (GPT-2's, BART's, the token labels) see
        real = length - (torch.arange(rows) + seed) % (PADDED + 1)
        mask = (torch.arange(length) < real[:, None]).long()
        ids[mask == 0] = pad
        if head.ends_with_eos:
            ids[torch.arange(rows), real - 1] = cfg.eos_token_id
        values["attention_mask"] = mask
        generator = torch.Generator().manual_seed(seed + 1)
        if head.labels == "token":
            labels = torch.randint(0, cfg.num_labels, ids.shape, generator=generator)
            labels[mask == 0] = -100
        else:
            labels = torch.randint(0, cfg.num_labels, (size,), generator=generator)
        return {**values, "labels": labels}
    return batch


def head_family(name: str, base: Family) -> HeadFamily:
    """The head ``name`` (a key of :data:`HEADS`) on ``base``: its configs with the head's labels, its batches."""
    head = HEADS[name]

    def make_config(config_name: str) -> Any:
        cfg = base.make_config(config_name)
        cfg.num_labels = LABELS
        cfg.problem_type = None  # single-label, chosen from the integer labels (whatever the base config presets)
        if head.pad_token_id is not None:
            cfg.pad_token_id = head.pad_token_id
        return cfg

    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return HeadFamily(**{**fields, "make_config": make_config, "train_batch": head_batch(head, base),
                         "head": head.class_name})


def class_family(base: Family, class_name: str) -> HeadFamily:
    """``base`` training ``class_name``: a head of :data:`HEADS` (its labels, pad id, batches), else another class
    of the base's own inputs (BERT's masked LM), on the base's configs."""
    name = next((name for name, head in HEADS.items() if head.class_name == class_name), None)
    if name is not None:
        return head_family(name, base)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return HeadFamily(**{**fields, "head": class_name})


def head_family_at(name: str, release: str) -> HeadFamily:
    """The head ``name`` at ``release`` (the release this process imports)."""
    if name not in HEADS:
        raise ValueError(f"no head family {name!r} (known: {', '.join(HEADS)})")
    base = importlib.import_module(f"support.{HEADS[name].base}_models").family_at(release)
    return head_family(name, base)
