"""Training examples from a ``datasets`` dataset (``--dataset PATH``): its columns, as the plan's class takes them.

``PATH`` is what users have on disk: a ``save_to_disk`` directory (one dataset,
or a ``DatasetDict`` whose ``--split`` is read, default ``train``), or a
Parquet, JSON Lines (``.jsonl``/``.json``) or CSV file (one split).  The rows
become the JSON Lines examples file the ranks read (:mod:`partitioning.train.data`
checks and pads it), so a dataset trains exactly as the same examples written by hand.

A split holding an ``input_ids`` column is **pre-tokenized**: every column named
as one of the plan's inputs is taken as it is.  Otherwise its text is tokenized
with the checkpoint's ``tokenizer.json`` (``tokenizers``), as the class needs
it; which class needs what is read off the plan's inputs, not off a family:

- a causal LM (``causal_lm``): ``--text-column`` (``text``), packed into rows of the
  plan's length exactly as ``--text`` packs a file's lines (:mod:`partitioning.train.text`);
- per-example labels (a sequence classifier): ``--text-column`` (``text``) and, for
  sentence pairs, ``--text-pair-column``; the label from ``--label-column`` (``label``,
  else ``labels``): an integer, or a name the checkpoint config's ``label2id`` maps;
- labels over a sequence of their own (a seq2seq model): source ``--text-column``
  (``text``), target ``--target-column`` (``target``), tokenized into ``labels``; the
  decoder's inputs are derived from the labels as stock derives them (shifted right,
  the config's ``decoder_start_token_id`` first);
- labels over the input's tokens drawn from ``num_labels`` (a token classifier): a
  list of words (``--text-column``, ``tokens``), a label per word (``--label-column``,
  ``ner_tags``, else ``labels``); the first token of each word is labelled, the rest
  and the special tokens -100, as HF's token-classification example does;
- labels over the input's tokens drawn from the vocabulary (a masked LM): ``--text-column``
  (``text``); 15 % of the non-special tokens are chosen with ``--seed``, their labels kept
  (every other label -100), 80 % of them replaced by the mask token, 10 % by a random
  token, 10 % left (BERT's recipe, HF's ``DataCollatorForLanguageModeling``).  The
  masking is drawn once, when the examples are written (static, as BERT's own data),
  not anew each epoch: the launcher says so.

Text longer than the plan's length is truncated (the tokenizer keeps its special
tokens), and the launcher counts the examples it cut.  A column the examples do
not use is named in a warning.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError
from families.definition import BATCH, InputSpec
from partitioning.train.data import IGNORED, is_label
from partitioning.train.text import TOKENIZER, load_tokenizer, pack_lines

SUFFIXES = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
MASKED = 0.15  # the share of tokens a masked LM predicts (the masked-LM recipe's)
MASK_TOKENS = ("[MASK]", "<mask>")
PREFIX = "train-model"


def datasets_module() -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError("--dataset needs the datasets package: pip install datasets") from None
    datasets.disable_progress_bars()  # the launcher's lines are the run's
    datasets.utils.logging.set_verbosity(logging.CRITICAL)  # a failure is our one line, not its log's too
    return datasets


def load_split(path: Path, split: str | None, flag: str, default: str, cache: Path) -> tuple[Any, str | None]:
    """The split of ``path`` to read (``split`` or, not given, ``default``) and its name where ``path`` has
    several; one line when there is none."""
    datasets = datasets_module()
    if path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except (FileNotFoundError, ValueError) as exc:
            raise UserError(f"{flag} {path} is not a directory save_to_disk wrote "
                            f"({' '.join(str(exc).split())[:160]})") from None
        if isinstance(loaded, datasets.DatasetDict):
            wanted = split or default
            if wanted not in loaded:
                raise UserError(f"{flag} {path} has no split {wanted!r} (its splits: {', '.join(loaded)}): give "
                                f"the split to read")
            return loaded[wanted], wanted
        if split is not None:
            raise UserError(f"{flag} {path} is one dataset, not a DatasetDict: it has no split {split!r}")
        return loaded, None
    builder = SUFFIXES.get(path.suffix.lower())
    if builder is None or not path.is_file():
        raise UserError(f"{flag} {path}: expected a save_to_disk directory or a {', '.join(SUFFIXES)} file")
    if split is not None and split != "train":
        raise UserError(f"{flag} {path} is one file, one split (train): it has no split {split!r}")
    try:
        return datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=str(cache)), None
    except Exception as exc:  # noqa: BLE001 (pyarrow's and datasets' parse errors have no common base)
        root = exc
        while root.__cause__ is not None or root.__context__ is not None:  # datasets wraps the parser's error
            root = root.__cause__ or root.__context__  # type: ignore[assignment]
        raise UserError(f"{flag} {path} is not readable as {builder}: {' '.join(str(root).split())[:200]}") from None


class Columns:
    """How one class's examples come from a split's columns (see the module's docstring)."""

    def __init__(self, specs: Sequence[InputSpec], causal_lm: bool, class_name: str, lengths: dict[str, int],
                 config: dict[str, Any], names: Mapping[str, str | None]) -> None:
        self.specs, self.causal_lm, self.class_name, self.config = specs, causal_lm, class_name, config
        self.by_name = {spec.name: spec for spec in specs}
        self.labels = [spec for spec in specs if is_label(spec.name) and spec.fill == "randint"]
        self.lengths = lengths
        self.kind = self._kind()
        self.text = names.get("text_column") or ("tokens" if self.kind == "token-classification" else "text")
        self.pair = names.get("text_pair_column")
        self.target = names.get("target_column") or "target"
        self.label = names.get("label_column")

    def _kind(self) -> str:
        if self.causal_lm:
            return "causal-lm"
        if len(self.labels) != 1 or "input_ids" not in self.by_name:
            return "pre-tokenized"  # several label inputs (a pre-training head's): no text convention gives them
        label, ids = self.labels[0], self.by_name["input_ids"]
        if label.shape == (BATCH,):
            return "sequence-classification"
        if label.shape != ids.shape:
            return "seq2seq"
        return "masked-lm" if label.high == "vocab_size" else "token-classification"

    def _length(self, spec: InputSpec) -> int:
        return self.lengths[str(next(d for d in spec.shape if d != BATCH))]

    def examples(self, split: Any, tokenizer_dir: Path | None, flag: str, seed: int) -> Iterator[dict[str, Any]]:
        columns = list(split.column_names)
        if "input_ids" in columns:
            used = [name for name in columns if name in self.by_name]
            self._unused(columns, used, flag)
            for number, row in enumerate(split.select_columns(used)):
                for name, value in row.items():
                    if not _ids(value) and value is not None:
                        raise UserError(f"{flag} row {number}: {name} must be a list of integers or an integer, not "
                                        f"{json.dumps(value, default=str)[:40]} (a CSV column holds text: give token "
                                        f"ids as Parquet, JSON Lines or a saved dataset)")
                yield row
            return
        if self.kind == "pre-tokenized":
            raise UserError(f"{flag}: the plan's {self.class_name} takes {', '.join(self.by_name)}, which no text "
                            f"column gives: give a split of those columns (pre-tokenized)")
        needed = [self.text] + ([self.pair] if self.pair else []) + (
            [self.target] if self.kind == "seq2seq" else [self._label_column(columns, flag)]
            if self.kind in ("sequence-classification", "token-classification") else [])
        missing = [name for name in needed if name not in columns]
        if missing:
            raise UserError(f"{flag} has no column {missing[0]!r} (its columns: {', '.join(columns)}); the plan's "
                            f"{self.class_name} reads {', '.join(needed)} (or pre-tokenized input_ids)")
        self._unused(columns, needed, flag)
        if tokenizer_dir is None:
            raise UserError(f"{flag}'s text is tokenized with a {TOKENIZER}: give --tokenizer DIR (the "
                            f"checkpoint's directory has none)")
        tokenizer = load_tokenizer(tokenizer_dir)
        if self.kind == "causal-lm":
            length = next(iter(self.lengths.values()))
            texts = [text for text in split[self.text] if isinstance(text, str) and text.strip()]
            if len(texts) != len(split):
                _warn(f"{flag}: {len(split) - len(texts)} rows of {self.text!r} hold no text: left out")
            for row in pack_lines(texts, tokenizer, tokenizer_dir, length, self.config.get("eos_token_id"), flag):
                yield {"input_ids": row, "labels": row}
            return
        yield from self._tokenized(split, tokenizer, needed, flag, seed)

    def _label_column(self, columns: list[str], flag: str) -> str:
        if self.label is not None:
            return self.label
        candidates = ("ner_tags", "labels", "label") if self.kind == "token-classification" else ("label", "labels")
        found = next((name for name in candidates if name in columns), None)
        if found is None:
            raise UserError(f"{flag} has no label column ({' or '.join(candidates)}; its columns: "
                            f"{', '.join(columns)}): name it with --label-column")
        return found

    def _unused(self, columns: list[str], used: list[str], flag: str) -> None:
        unused = [name for name in columns if name not in used]
        if unused:
            _warn(f"{flag}: columns not used by the plan's {self.class_name}: {', '.join(unused)}")

    def _tokenized(self, split: Any, tokenizer: Any, needed: list[str], flag: str,
                   seed: int) -> Iterator[dict[str, Any]]:
        ids = self.by_name["input_ids"]
        label = self.labels[0]
        tokenizer.enable_truncation(self._length(ids))
        cut = 0
        generator = torch.Generator().manual_seed(seed)
        mask = self._mask_id(tokenizer, flag) if self.kind == "masked-lm" else None
        for number, row in enumerate(split.select_columns(needed)):
            where = f"{flag} row {number}"
            if self.kind == "token-classification":
                words, tags = row[self.text], row[needed[-1]]
                if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
                    raise UserError(f"{where}: {self.text} must be a list of words")
                encoding = tokenizer.encode(words, is_pretokenized=True)
                labels = self._word_labels(encoding.word_ids, tags, where)
            else:
                text = _text(row[self.text], self.text, where)
                pair = _text(row[self.pair], self.pair, where) if self.pair else None
                encoding = tokenizer.encode(text, pair)
            cut += bool(encoding.overflowing)
            example: dict[str, Any] = {"input_ids": list(encoding.ids)}
            if "token_type_ids" in self.by_name and self.pair:
                example["token_type_ids"] = list(encoding.type_ids)
            if self.kind == "sequence-classification":
                example[label.name] = self._class_index(row[needed[-1]], where)
            elif self.kind == "token-classification":
                example[label.name] = labels
            elif self.kind == "seq2seq":
                tokenizer.enable_truncation(self._length(label))
                target = tokenizer.encode(_text(row[self.target], self.target, where))
                tokenizer.enable_truncation(self._length(ids))
                cut += bool(target.overflowing)
                example[label.name] = list(target.ids)
                if "decoder_input_ids" in self.by_name:
                    example["decoder_input_ids"] = [self._decoder_start(flag)] + list(target.ids)[:-1]
            else:
                assert mask is not None
                example["input_ids"], example[label.name] = self._masked(encoding, mask, generator)
            yield example
        if cut:
            _warn(f"{flag}: {cut} texts longer than the plan's lengths ({', '.join(map(str, self.lengths.values()))}"
                  f" tokens) were truncated")
        if self.kind == "masked-lm":
            print(f"{PREFIX}: {flag}: {MASKED:.0%} of the tokens masked once with --seed {seed} (static masking: "
                  f"each epoch sees the same masks)", flush=True)

    def _word_labels(self, word_ids: list[int | None], tags: Any, where: str) -> list[int]:
        if not isinstance(tags, list) or not all(isinstance(tag, int) and not isinstance(tag, bool) for tag in tags):
            raise UserError(f"{where}: the word labels must be a list of integers")
        labels, previous = [], None
        for word in word_ids:
            if word is not None and word >= len(tags):
                raise UserError(f"{where}: {len(tags)} labels for more words")
            labels.append(IGNORED if word is None or word == previous else tags[word])
            previous = word
        return labels

    def _class_index(self, value: Any, where: str) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        known = self.config.get("label2id") or {}
        if isinstance(value, str) and isinstance(known.get(value), int):
            return int(known[value])
        raise UserError(f"{where}: label {json.dumps(value)[:40]} is neither a class index nor a name of the "
                        f"checkpoint config's label2id ({', '.join(map(str, known)) or 'none'})")

    def _decoder_start(self, flag: str) -> int:
        start = self.config.get("decoder_start_token_id")
        if not isinstance(start, int) or isinstance(start, bool):
            raise UserError(f"{flag}: the decoder's inputs are the labels shifted right behind the config's "
                            f"decoder_start_token_id, which the checkpoint's config lacks")
        return start

    def _mask_id(self, tokenizer: Any, flag: str) -> int:
        for token in MASK_TOKENS:
            if tokenizer.token_to_id(token) is not None:
                return int(tokenizer.token_to_id(token))
        raise UserError(f"{flag}: a masked LM's text is masked with the tokenizer's mask token, and it has none of "
                        f"{', '.join(MASK_TOKENS)}")

    def _masked(self, encoding: Any, mask: int, generator: torch.Generator) -> tuple[list[int], list[int]]:
        ids = torch.tensor(encoding.ids)
        special = torch.tensor(encoding.special_tokens_mask, dtype=torch.bool)
        chosen = (torch.rand(len(ids), generator=generator) < MASKED) & ~special
        labels = torch.where(chosen, ids, IGNORED)
        replaced = chosen & (torch.rand(len(ids), generator=generator) < 0.8)
        randomized = chosen & ~replaced & (torch.rand(len(ids), generator=generator) < 0.5)
        vocab = self.config.get("vocab_size")
        if not isinstance(vocab, int) or isinstance(vocab, bool):
            raise UserError("a masked LM's random replacement tokens are drawn below the config's vocab_size, "
                            "which the checkpoint's config lacks")
        drawn = torch.randint(vocab, (len(ids),), generator=generator)
        ids = torch.where(replaced, mask, torch.where(randomized, drawn, ids))
        return ids.tolist(), labels.tolist()


def _ids(value: Any) -> bool:
    """An integer, or a list of integers: what a pre-tokenized column holds."""
    def whole(item: Any) -> bool:
        return isinstance(item, int) and not isinstance(item, bool)
    return whole(value) or isinstance(value, list) and all(whole(item) for item in value)


def _text(value: Any, column: str, where: str) -> str:
    if not isinstance(value, str):
        raise UserError(f"{where}: {column} must be text, not {json.dumps(value, default=str)[:40]}")
    return value


def _warn(message: str) -> None:
    print(f"{PREFIX}: warning: {message}", file=sys.stderr, flush=True)


def write_examples(columns: Columns, split: Any, tokenizer_dir: Path | None, flag: str, seed: int, out: Path) -> int:
    """The split's examples as the JSON Lines file the ranks read; their count."""
    count = 0
    with out.open("w", encoding="utf-8") as handle:
        for example in columns.examples(split, tokenizer_dir, flag, seed):
            handle.write(json.dumps(example) + "\n")
            count += 1
    if count == 0:
        raise UserError(f"{flag} gives no examples (the split is empty)")
    return count
