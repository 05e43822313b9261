"""What ``train-model`` turns into the JSON Lines examples files its ranks read, before they start.

The ranks read one form of data (:mod:`partitioning.train.data`); the launcher
writes it from raw text (``--text``, :mod:`partitioning.train.text`) or from a
``datasets`` dataset (``--dataset``, and ``--eval-split``/``--eval-dataset`` for
evaluation, :mod:`partitioning.train.columns`) into a scratch directory that
lives as long as the run.  ``--data``/``--eval-data`` files are read as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError
from partitioning.train.columns import Columns, load_split, write_examples
from partitioning.train.text import TOKENIZER
from partitioning.train.text import write_examples as write_text_examples

TRAIN_SPLIT, EVAL_SPLIT = "train", "validation"  # the splits HF's example scripts read


@dataclass(frozen=True)
class Sources:
    """Where a run's examples come from (``train-model``'s data flags)."""

    data: Path | None = None
    text: Path | None = None
    dataset: Path | None = None
    split: str | None = None
    eval_data: Path | None = None
    eval_dataset: Path | None = None
    eval_split: str | None = None
    tokenizer: Path | None = None
    text_column: str | None = None
    text_pair_column: str | None = None
    target_column: str | None = None
    label_column: str | None = None

    @property
    def converted(self) -> bool:
        """Whether the launcher writes the examples (each machine of a multi-node run then converts its own)."""
        return any(source is not None for source in (self.text, self.dataset, self.eval_dataset, self.eval_split))


def tokenizer_dir(sources: Sources, start: Path) -> Path | None:
    """``--tokenizer``, else the checkpoint's own directory where it holds a tokenizer.json."""
    if sources.tokenizer is not None:
        return sources.tokenizer
    return start if (start / TOKENIZER).is_file() else None


def examples_files(sources: Sources, specs: Any, causal_lm: bool, class_name: str, lengths: dict[str, int],
                   config: dict[str, Any], start: Path, seed: int, scratch: Path) -> tuple[Path, Path | None]:
    """The training and evaluation examples files of ``sources`` (written under ``scratch`` where converted);
    ``config`` is the checkpoint's, the one trained.  Every split is found before any is converted."""
    splits: dict[str, tuple[Any, str]] = {}  # the examples file's name -> the split to convert, as the user named it
    if sources.dataset is not None:
        splits["train"] = _split(sources.dataset, sources.split, "--dataset", TRAIN_SPLIT, scratch)
    if sources.eval_dataset is not None or sources.eval_split is not None:
        source = sources.eval_dataset or sources.dataset
        assert source is not None, "parse() refuses --eval-split without a dataset"
        flag = "--eval-dataset" if sources.eval_dataset is not None else "--dataset"
        splits["eval"] = _split(source, sources.eval_split, flag, EVAL_SPLIT, scratch)
    names = {"text_column": sources.text_column, "text_pair_column": sources.text_pair_column,
             "target_column": sources.target_column, "label_column": sources.label_column}
    columns = Columns(specs, causal_lm, class_name, lengths, config, names)
    written = {}
    for name, (split, shown) in splits.items():
        written[name] = scratch / f"{name}.jsonl"
        count = write_examples(columns, split, tokenizer_dir(sources, start), shown, seed, written[name])
        print(f"train-model: {shown}: {count} examples ({columns.kind})", flush=True)
    if sources.text is not None:
        tokenizer = tokenizer_dir(sources, start)
        if tokenizer is None:
            raise UserError(f"--text FILE is tokenized with a {TOKENIZER}: give --tokenizer DIR (the checkpoint's "
                            f"directory {start} has none)")
        written["train"] = scratch / "text.jsonl"
        write_text_examples(sources.text, tokenizer, causal_lm, lengths, written["train"], class_name,
                            config.get("eos_token_id"))
    data = written.get("train", sources.data)
    assert data is not None  # parse() demands one source
    return data, written.get("eval", sources.eval_data)


def _split(path: Path, split: str | None, flag: str, default: str, scratch: Path) -> tuple[Any, str]:
    """The split to read, and how messages name it."""
    cache = scratch / "datasets-cache"  # datasets' Arrow cache of a file it reads: the run's scratch, not ~/.cache
    chosen, name = load_split(path, split, flag, default, cache)
    return chosen, f"{flag} {path}" + (f" split {name}" if name is not None else "")
