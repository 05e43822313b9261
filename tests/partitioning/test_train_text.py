"""train-model --text FILE --tokenizer DIR: raw text tokenized with the checkpoint's tokenizer.json, packed, trained.

The tokenizer is built here (a word-level ``tokenizers`` model over a fixed vocabulary, so the ids below are
known), no download.  Packing: each line encoded, ``<|endoftext|>`` between lines, rows of the plan's length,
the short tail dropped, labels = input ids.  The command packs and trains GPT-2 on 2 ranks, equal to the same
steps in one process on the same rows; hostile input is one line, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.gpt2_models import TRAIN_SEQUENCE
from support.threads import RANK_THREADS
from test_train_model import OPTIONS, assert_saved_equals, reference, save_checkpoint, write_plan

from partitioning.train.cli import main
from partitioning.train.text import pack, tokenizers_module, write_examples

WORDS = ["<unk>", "<|endoftext|>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
TEXT = "the cat sat on the mat\n\na dog ran\nthe dog sat on a cat on the mat\n"
# ids: the=2 cat=3 sat=4 on=5 mat=6 a=7 dog=8 ran=9, <|endoftext|>=1 between lines, <unk>=0
IDS = [2, 3, 4, 5, 2, 6, 1, 7, 8, 9, 1, 2, 8, 4, 5, 7, 3, 5, 2, 6]


def write_tokenizer(directory: Path) -> Path:
    tokenizers = tokenizers_module()
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def test_pack(tmp_path: Path) -> None:
    tokenizer = write_tokenizer(tmp_path / "tok")
    (tmp_path / "text.txt").write_text(TEXT)
    assert pack(tmp_path / "text.txt", tokenizer, 7) == [IDS[0:7], IDS[7:14]]  # 20 ids: the last 6 dropped
    assert pack(tmp_path / "text.txt", tokenizer, 20) == [IDS]
    write_examples(tmp_path / "text.txt", tokenizer, True, {"sequence": 10}, tmp_path / "out.jsonl", "GPT2LMHeadModel")
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert rows == [{"input_ids": IDS[:10], "labels": IDS[:10]}, {"input_ids": IDS[10:], "labels": IDS[10:]}]


def test_the_separator_is_the_tokenizers_or_the_configs_end_of_text(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Llama 3's end of text is ``<|end_of_text|>``, named by its tokenizer config and its config's eos_token_id;
    a WordPiece vocabulary (MiniLM's) has none of the known names: the lines run together, and a warning says so."""
    (tmp_path / "text.txt").write_text(TEXT)
    tokenizer = write_tokenizer(tmp_path / "tok")
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "a"}}))
    assert pack(tmp_path / "text.txt", tokenizer, 20) == [[7 if i == 1 else i for i in IDS]]  # "a" (7) between
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"eos_token": "absent-token"}))
    assert pack(tmp_path / "text.txt", tokenizer, 20, eos_token_id=[9, 1]) == [[9 if i == 1 else i for i in IDS]]
    assert pack(tmp_path / "text.txt", tokenizer, 20, eos_token_id=10**6) == [IDS]  # out of the vocabulary: named
    assert capsys.readouterr().err == ""
    bare = tmp_path / "bare"
    tokenizers = tokenizers_module()
    words = [w for w in WORDS if w != "<|endoftext|>"]
    plain = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    plain.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    bare.mkdir()
    plain.save(str(bare / "tokenizer.json"))
    assert len(pack(tmp_path / "text.txt", bare, 18)[0]) == 18  # the 18 words, nothing between the lines
    err = capsys.readouterr().err
    assert err.startswith("train-model: warning: --text ") and "no token between them" in err and err.count("\n") == 1
    plain.post_processor = tokenizers.processors.TemplateProcessing(single="<unk> $A", special_tokens=[("<unk>", 0)])
    plain.save(str(bare / "tokenizer.json"))
    assert pack(tmp_path / "text.txt", bare, 21)[0][:8] == [0, 1, 2, 3, 4, 1, 5, 0]  # each line opens with its own token
    assert capsys.readouterr().err == ""


def test_a_bom_and_crlf_line_ends_pack_the_same_rows(tmp_path: Path) -> None:
    """What an editor on Windows writes: the byte order mark would be a character of the first word (an unknown
    token, 0), and a line end \r\n a line end like \n."""
    tokenizer = write_tokenizer(tmp_path / "tok")
    (tmp_path / "windows.txt").write_bytes(b"\xef\xbb\xbf" + TEXT.replace("\n", "\r\n").encode())
    assert pack(tmp_path / "windows.txt", tokenizer, 20) == [IDS]


def test_text_trains_gpt2_as_one_process_and_hostile_input(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", str(RANK_THREADS))  # the ranks' count, as the reference runs with
    checkpoint, tokenizer = tmp_path / "checkpoint", write_tokenizer(tmp_path / "checkpoint")
    cfg = save_checkpoint("gpt2", checkpoint)
    plan, text = tmp_path / "plan.json", tmp_path / "text.txt"
    write_plan("gpt2", cfg, "transformer.h.2", "gpipe", plan)
    text.write_text(TEXT * 3)
    base = ["--plan", str(plan), "--checkpoint", str(checkpoint), "--steps", "2"]

    def refused(*argv: str) -> str:
        code, err = main([*base, *argv]), capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("train-model: error: "), err
        return err

    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "bare").mkdir()
    assert "no tokenizer.json" in refused("--text", str(text), "--tokenizer", str(tmp_path / "bare"))
    assert "holds no text" in refused("--text", str(tmp_path / "empty.txt"), "--tokenizer", str(tokenizer))
    bare_checkpoint = tmp_path / "untokenized"  # the checkpoint without its tokenizer: --tokenizer is needed
    save_checkpoint("gpt2", bare_checkpoint)
    assert "give --tokenizer DIR (the checkpoint's directory" in refused("--text", str(text), "--checkpoint",
                                                                        str(bare_checkpoint))
    assert "one of them" in refused("--text", str(text), "--tokenizer", str(tokenizer), "--data", str(text))
    t5 = tmp_path / "t5.json"
    write_plan("t5", save_checkpoint("t5", tmp_path / "t5"), "encoder.block.1", "gpipe", t5)
    assert "trains causal LMs" in refused("--text", str(text), "--tokenizer", str(tokenizer), "--plan", str(t5))

    assert main([*base, "--text", str(text), "--save", str(tmp_path / "out"), *OPTIONS]) == 0  # its own tokenizer
    packed = tmp_path / "packed.jsonl"
    write_examples(text, tokenizer, True, {"sequence": TRAIN_SEQUENCE}, packed, "GPT2LMHeadModel")
    assert_saved_equals("gpt2", tmp_path / "out", reference("gpt2", checkpoint, plan, packed, 2))
