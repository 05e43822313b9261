"""Training examples from a JSON Lines file, padded to the plan's lengths, served in a seeded order.

Each line is one example: an object holding the inputs the family's
``[pipeline.inputs]`` name for the planned class (a list of integers per
sequence, one integer for a per-example input such as BERT's
``next_sentence_label``).  Token ids and labels are required; an input filled
with ones (an attention mask) defaults to ones over the example's length, one
filled with zeros (token type ids) to zeros.  Shorter sequences are padded to
the plan's length: ids with the config's ``pad_token_id`` (0 when it has
none), masks with 0, labels (an input named ``*labels``/``*label``, Hugging
Face's convention) with -100, which the loss ignores.  A longer one is an error.
An input whose spec names its ``last`` value (an end-of-sequence token a
sequence classifier reads its positions off) must end with it, as often in
every example (the model requires it of every row).

Step ``s`` takes examples ``s*B .. (s+1)*B - 1`` of the endless sequence of
epochs, epoch ``e`` being a permutation drawn from ``seed + e``: the order is
fixed by the seed, and a resumed run continues at its step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError
from common.files import read_text
from families.definition import BATCH, InputSpec
from families.models import MicroBatch

MAX_DATA_BYTES = 1 << 30
IGNORED = -100  # the label the loss ignores (torch's CrossEntropyLoss ignore_index default)


def is_label(name: str) -> bool:
    return name.endswith("labels") or name.endswith("label")


def _bound(value: int | str | None, config: Any) -> int | None:
    if value is None or isinstance(value, int):
        return value
    found = getattr(config, value, None)
    return found if isinstance(found, int) and not isinstance(found, bool) else None


@dataclass
class Dataset:
    """Every example of the file, padded: ``tensors[name]`` is ``[examples, *shape]``."""

    tensors: dict[str, torch.Tensor]
    count: int

    def order(self, epoch: int, seed: int) -> torch.Tensor:
        return torch.randperm(self.count, generator=torch.Generator().manual_seed(seed + epoch))

    def batch(self, step: int, size: int, seed: int) -> dict[str, torch.Tensor]:
        """The ``size`` examples of step ``step`` (0-based), in the seeded order."""
        indices, orders = [], {}
        for position in range(step * size, (step + 1) * size):
            epoch, index = divmod(position, self.count)
            if epoch not in orders:
                orders[epoch] = self.order(epoch, seed)
            indices.append(int(orders[epoch][index]))
        chosen = torch.tensor(indices)
        return {name: tensor[chosen] for name, tensor in self.tensors.items()}


def read_dataset(path: Path, specs: Sequence[InputSpec], config: Any, micro_batch: MicroBatch,
                 batch_size: int) -> Dataset:
    """The examples of ``path``, each checked and padded; any bad line is one error naming it."""
    text = read_text(path, "data", MAX_DATA_BYTES)
    pad = config.pad_token_id if isinstance(getattr(config, "pad_token_id", None), int) else 0
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and not 0 <= pad < vocab:
        raise UserError(f"the config's pad_token_id {pad} lies outside the vocabulary [0, {vocab}): padding writes "
                        f"it as a token id (give a config whose pad_token_id is a token)")
    columns: dict[str, list[torch.Tensor]] = {spec.name: [] for spec in specs}
    count = 0
    marked = [(spec.name, last) for spec in specs if (last := _bound(spec.last, config)) is not None]
    first: tuple[int, tuple[int, ...]] | None = None  # the first example's line, how often it holds each marked value
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            example = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path} line {number}: not JSON ({exc.msg})") from None
        if not isinstance(example, dict):
            raise UserError(f"{path} line {number}: an example is a JSON object, not {type(example).__name__}")
        for name, value in _example(example, specs, config, micro_batch, pad, f"{path} line {number}").items():
            columns[name].append(value)
        count += 1
        held = tuple((example.get(name) or []).count(last) for name, last in marked)
        first = first or (number, held)
        if held != first[1]:  # the model reads each row's last one, requiring as many in every row
            raise UserError(f"{path} line {number}: holds {_times(marked, held)}, line {first[0]} "
                            f"{_times(marked, first[1])}: every example must hold them as often")
    if count == 0:
        raise UserError(f"{path} holds no examples (one JSON object per line)")
    if count < batch_size:
        raise UserError(f"{path} holds {count} examples, fewer than one step's batch of {batch_size}")
    return Dataset({name: torch.stack(values) for name, values in columns.items()}, count)


def check_learnable(dataset: Dataset, specs: Sequence[InputSpec], causal_lm: bool, path: Path) -> None:
    """Refuse a file whose every label the loss ignores: its loss is 0 / 0, NaN, at every step.  A causal LM
    predicts each token from the ones before it, so the first label of a sequence is shifted away (a one-token
    example has nothing to predict)."""
    learnable = 0
    for spec in specs:
        if not is_label(spec.name) or spec.name not in dataset.tensors:
            continue
        labels = dataset.tensors[spec.name]
        if labels.dim() > 1 and causal_lm:
            labels = labels[:, 1:]
        learnable += int((labels != IGNORED).sum())
    if learnable == 0 and any(is_label(spec.name) for spec in specs):
        shifted = ", or the first of its sequence, which the causal LM shifts away" if causal_lm else ""
        raise UserError(f"{path}: no example has a label to learn (every label is {IGNORED}{shifted}): the loss "
                        f"would be NaN at every step")


def _times(marked: list[tuple[str, int]], counts: tuple[int, ...]) -> str:
    return ", ".join(f"{name} {last} {times} times" for (name, last), times in zip(marked, counts))


def _example(example: dict[str, Any], specs: Sequence[InputSpec], config: Any, micro_batch: MicroBatch,
             pad: int, where: str) -> dict[str, torch.Tensor]:
    known = {spec.name for spec in specs}
    unknown = sorted(set(example) - known)
    if unknown:
        raise UserError(f"{where}: unknown field {unknown[0]!r} (this plan's inputs: {', '.join(sorted(known))})")
    lengths: dict[str, tuple[str, int]] = {}  # dimension -> (the field that set it, its length)
    values = {}
    for spec in specs:
        dims = [d for d in spec.shape if d != BATCH]
        value = example.get(spec.name)
        if value is None:
            if spec.fill == "randint":
                raise UserError(f"{where}: no {spec.name!r} (required: "
                                f"{', '.join(s.name for s in specs if s.fill == 'randint')})")
            continue
        if not dims:
            if isinstance(value, bool) or not isinstance(value, int):
                raise UserError(f"{where}: {spec.name} must be an integer, not {json.dumps(value)[:40]}")
            values[spec.name] = [value]
            continue
        if len(dims) != 1 or not isinstance(dims[0], str):
            raise UserError(f"{where}: {spec.name} has shape {spec.shape}, which a data file cannot give")
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise UserError(f"{where}: {spec.name} must be a list of integers")
        limit = micro_batch.size(dims[0])
        if not value:
            raise UserError(f"{where}: {spec.name} is empty")
        if len(value) > limit:
            raise UserError(f"{where}: {spec.name} has {len(value)} tokens, the plan's {dims[0]} length is {limit}")
        if dims[0] in lengths and lengths[dims[0]][1] != len(value):
            field, length = lengths[dims[0]]
            raise UserError(f"{where}: {spec.name} has {len(value)} tokens, {field} {length}: they must match")
        lengths.setdefault(dims[0], (spec.name, len(value)))
        last = _bound(spec.last, config)
        if last is not None and value[-1] != last:
            raise UserError(f"{where}: {spec.name} ends with {value[-1]}; this class reads each sequence's last "
                            f"{last} ({spec.last}), which ends it")
        values[spec.name] = value
    padded = {}
    for spec in specs:
        _check_range(spec, values.get(spec.name), config, where)
        dims = [d for d in spec.shape if d != BATCH]
        if not dims:
            padded[spec.name] = torch.tensor(values[spec.name][0])  # required: checked above
            continue
        limit = micro_batch.size(dims[0])
        if spec.name in values:
            given = values[spec.name]
        else:
            length = lengths.get(str(dims[0]), (None, limit))[1]
            given = [1 if spec.fill == "ones" else 0] * length
        filler = IGNORED if is_label(spec.name) else 0 if spec.fill in ("ones", "zeros") else pad
        padded[spec.name] = torch.tensor(given + [filler] * (limit - len(given)), dtype=torch.long)
    return padded


def _check_range(spec: InputSpec, value: list[int] | None, config: Any, where: str) -> None:
    if value is None or spec.fill != "randint":
        return
    high = _bound(spec.high, config)
    ignored = IGNORED if is_label(spec.name) else None
    bad = next((v for v in value if v != ignored and (v < 0 or (high is not None and v >= high))), None)
    if bad is not None:
        raise UserError(f"{where}: {spec.name} holds {bad}, outside [0, {high})"
                        f"{' (or -100: ignored)' if ignored is not None else ''}")
