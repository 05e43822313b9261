"""Every family the model tests know, by name (a new family: its <family>_models.py and one line here)."""

from __future__ import annotations

import torch

from support import t5_models
from support.bart_models import BART
from support.bert_models import BERT
from support.gpt2_models import GPT2
from support.model_checks import Family, Inputs
from support.roberta_models import ROBERTA
from support.t5_cases import TRAIN_SOURCE as T5_SOURCE
from support.t5_cases import TRAIN_TARGET as T5_TARGET


def t5_train_batch(cfg: object, size: int, seed: int) -> Inputs:
    """A T5ForConditionalGeneration training batch: padding in both masks, some ignored labels."""
    vocab = cfg.vocab_size  # type: ignore[attr-defined]
    generator = torch.Generator().manual_seed(seed)
    values = {"input_ids": torch.randint(1, vocab, (size, T5_SOURCE), generator=generator),
              "attention_mask": torch.ones(size, T5_SOURCE, dtype=torch.long),
              "decoder_input_ids": torch.randint(1, vocab, (size, T5_TARGET), generator=generator),
              "decoder_attention_mask": torch.ones(size, T5_TARGET, dtype=torch.long),
              "labels": torch.randint(1, vocab, (size, T5_TARGET), generator=generator)}
    values["attention_mask"][1::2, -2:] = 0  # padding in every other sequence
    values["decoder_attention_mask"][::2, -1] = 0
    values["labels"][::3, -2:] = -100  # ignored positions
    return values


def _t5_inputs(masks: bool, batch: int = 2, seed: int = 1, source: int = 7, target: int = 5,
               config_name: str = "") -> Inputs:
    return t5_models.inputs(masks, batch, source, target, seed)


_T5_PATHS = {"T5ForConditionalGeneration": ("labels", "labels-only", "logits"), "T5Model": ("hidden",),
             "T5EncoderModel": ("hidden",)}

# T5's own test files (test_t5_*.py, test_stateless.py) predate the family-generic ones and check the same;
# T5 is here for the pipelining worker and any generic test that names it.
T5 = Family("t5", "4.5.1", t5_models.stock, t5_models.generated, t5_models.config, tuple(t5_models.CONFIGS),
            _T5_PATHS, _t5_inputs, t5_models.call_kwargs, t5_models.reference_output,
            lengths={"source": 9, "target": 4}, train_batch=t5_train_batch,
            train_lengths={"source": T5_SOURCE, "target": T5_TARGET})

FAMILIES: dict[str, Family] = {"t5": T5, "gpt2": GPT2, "bert": BERT, "roberta": ROBERTA, "bart": BART}
# The families the generic model tests (test_model_*.py) run on.
GENERIC = [GPT2, BERT, ROBERTA, BART]
