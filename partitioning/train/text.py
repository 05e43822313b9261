"""Raw text for a causal LM (``--text FILE``): tokenized with the checkpoint's tokenizer, packed to the plan's length.

The tokenizer's ``DIR/tokenizer.json`` (``--tokenizer DIR``, else the checkpoint's) is read with the
``tokenizers`` package.  Each non-empty line of the text is encoded on its own
(with the special tokens the tokenizer's post-processor adds), the ids of all
lines are concatenated in file order, with the end-of-text token between lines
(:func:`separator`: the ``eos_token`` of ``DIR/tokenizer_config.json``, else the
checkpoint config's ``eos_token_id``, else a token named ``<|endoftext|>``,
``</s>`` or ``<eos>``; where there is none and the post-processor delimits no
line, a warning says that the documents run together), and cut into rows of the
plan's sequence length; the last, shorter row is dropped.  A row is
one example: ``input_ids`` and ``labels`` are the same ids (the model shifts its
labels itself), the attention mask all ones.  Packing is a pure function of the
text, the tokenizer and the length, so the seeded order (:mod:`partitioning.train.data`)
and a resumed run see the same examples.

transformers 4.5.1 refuses to import next to a ``tokenizers`` other than
0.10.x, which has no wheel for current Pythons, so ``scripts/setup.sh``
installs ``tokenizers`` beside the venv (``.venv/tokenizers``) and only this
module puts it on the path, after transformers is imported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from common.errors import UserError
from common.files import read_json_object, read_text

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
MAX_CONFIG_BYTES = 1 << 24
TOKENIZERS_DIR = Path(__file__).resolve().parents[2] / ".venv" / "tokenizers"
END_OF_TEXT = ("<|endoftext|>", "</s>", "<eos>")
MAX_TEXT_BYTES = 1 << 30


def tokenizers_module() -> Any:
    """The ``tokenizers`` package (installed beside the venv by scripts/setup.sh)."""
    import transformers  # noqa: F401 (first: its import-time version check must not see tokenizers)

    if str(TOKENIZERS_DIR) not in sys.path and TOKENIZERS_DIR.is_dir():
        sys.path.append(str(TOKENIZERS_DIR))
    try:
        import tokenizers
    except ImportError:
        raise UserError(f"--text needs the tokenizers package in {TOKENIZERS_DIR}: run scripts/setup.sh") from None
    return tokenizers


def load_tokenizer(directory: Path) -> Any:
    path = directory / TOKENIZER
    if not path.is_file():
        raise UserError(f"--tokenizer {directory} has no {TOKENIZER} (give the checkpoint's tokenizer directory)")
    try:
        tokenizer = tokenizers_module().Tokenizer.from_file(str(path))
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 (not JSON, or not a tokenizer)
        raise UserError(f"{path} is not a tokenizers file: {' '.join(str(exc).split())[:200]}") from None
    # the file's own padding and truncation (a checkpoint's may set them) are not the plan's lengths: packing
    # cuts the whole text, and a dataset's examples are truncated to the plan's lengths where they are read
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _configured_eos(tokenizer_dir: Path) -> str | None:
    """``eos_token`` of ``tokenizer_dir/tokenizer_config.json`` (a string, or an added token's ``content``)."""
    path = tokenizer_dir / TOKENIZER_CONFIG
    if not path.is_file():
        return None
    token = read_json_object(path, "tokenizer config", MAX_CONFIG_BYTES).get("eos_token")
    token = token.get("content") if isinstance(token, dict) else token
    return token if isinstance(token, str) else None


def separator(tokenizer: Any, tokenizer_dir: Path, eos_token_id: Any) -> tuple[int | None, str]:
    """The id put between two lines, and where it was found: the tokenizer config's ``eos_token``, the model
    config's ``eos_token_id`` (the first of a list), a token of :data:`END_OF_TEXT`; ``(None, why)`` when none
    is found."""
    configured = _configured_eos(tokenizer_dir)
    if configured is not None and tokenizer.token_to_id(configured) is not None:
        return tokenizer.token_to_id(configured), f"{TOKENIZER_CONFIG}'s eos_token {configured!r}"
    first = eos_token_id[0] if isinstance(eos_token_id, list) and eos_token_id else eos_token_id
    if isinstance(first, int) and not isinstance(first, bool) and 0 <= first < tokenizer.get_vocab_size():
        return first, f"the config's eos_token_id {first}"
    for token in END_OF_TEXT:
        if tokenizer.token_to_id(token) is not None:
            return tokenizer.token_to_id(token), f"the token {token!r}"
    return None, f"no eos_token in {TOKENIZER_CONFIG}, no eos_token_id in the config, no {' '.join(END_OF_TEXT)}"


def pack(text_path: Path, tokenizer_dir: Path, length: int, eos_token_id: Any = None) -> list[list[int]]:
    """The rows of ``length`` ids the text packs into (see the module's docstring)."""
    tokenizer = load_tokenizer(tokenizer_dir)
    lines = [line for line in read_text(text_path, "--text", MAX_TEXT_BYTES).splitlines() if line.strip()]
    if not lines:
        raise UserError(f"--text {text_path} holds no text")
    return pack_lines(lines, tokenizer, tokenizer_dir, length, eos_token_id, f"--text {text_path}")


def pack_lines(lines: list[str], tokenizer: Any, tokenizer_dir: Path, length: int, eos_token_id: Any,
               source: str) -> list[list[int]]:
    """``lines`` (each a document) packed into rows of ``length`` ids; ``source`` names them in messages."""
    if not lines:
        raise UserError(f"{source} holds no text")
    end, found = separator(tokenizer, tokenizer_dir, eos_token_id)
    delimited = tokenizer.encode(lines[0]).ids != tokenizer.encode(lines[0], add_special_tokens=False).ids
    if end is None and not delimited and len(lines) > 1:
        print(f"train-model: warning: {source}: its lines are packed with no token between them ({found}): "
              f"each document runs into the next", file=sys.stderr)
    ids: list[int] = []
    for index, encoding in enumerate(tokenizer.encode_batch(lines)):
        ids += ([end] if index and end is not None else []) + list(encoding.ids)
    if len(ids) < length:
        raise UserError(f"{source} is {len(ids)} tokens long: less than one sequence of {length}")
    return [ids[start:start + length] for start in range(0, len(ids) - length + 1, length)]


def write_examples(text_path: Path, tokenizer_dir: Path, causal_lm: bool, lengths: dict[str, int], out: Path,
                   class_name: str, eos_token_id: Any = None) -> int:
    """Pack the text into ``out`` (JSON Lines of ``input_ids`` and ``labels``); the number of examples."""
    if not causal_lm:
        raise UserError(f"--text trains causal LMs (labels = the input ids); the plan trains a {class_name}: "
                        f"give --data FILE with its inputs")
    if len(lengths) != 1:
        raise UserError(f"--text packs one sequence; the plan's {class_name} has {', '.join(lengths)}")
    rows = pack(text_path, tokenizer_dir, next(iter(lengths.values())), eos_token_id)
    out.write_text("".join(json.dumps({"input_ids": row, "labels": row}) + "\n" for row in rows))
    return len(rows)
