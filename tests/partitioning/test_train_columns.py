"""train-model --dataset PATH: a ``datasets`` dataset's columns as each class takes them, trained as written by hand.

The tokenizer is built here (a word-level ``tokenizers`` model over a fixed vocabulary with BERT's
``[CLS] $A [SEP]`` post-processor, so every id below is known by construction), no download.  Every training
class of every family's recipe gets a dataset of the conventional columns, and the examples written must be
read by the ranks' own reader; each kind's examples are checked id by id.  Runs train on 2 ranks from a
dataset on disk with --epochs 1, equal to the same steps in one process on the examples the conversion wrote:
T5 (seq2seq: the decoder's inputs derived from the labels) from a save_to_disk DatasetDict and GPT-2 from JSON
Lines, both evaluated (equal to stock eval mode), BERT's token classifier from Parquet, and BERT's sequence
classifier (sentence pairs, labels by name) from Parquet.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import datasets
import pytest
from support import train_runs
from support.heads import class_family
from support.model_families import FAMILIES
from support.threads import RANK_THREADS
from support.train_runs import MICRO_BATCHES, OPTIONS, PER_MICRO_BATCH
from test_train_eval import stock_eval_loss
from test_train_model import head_case

from common.errors import UserError
from families.models import MicroBatch
from partitioning.files import read_plan
from partitioning.train.cli import main
from partitioning.train.columns import Columns, load_split, write_examples
from partitioning.train.data import IGNORED, read_dataset
from partitioning.train.layout import METRICS
from partitioning.train.stage import plan_model
from partitioning.train.text import pack_lines, tokenizers_module

datasets.disable_progress_bars()  # this module's own writes (to_parquet) print nothing the captured errors would hold
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
ID = {word: index for index, word in enumerate(WORDS)}
CLS, SEP = ID["[CLS]"], ID["[SEP]"]
TEXTS = ["the cat sat on the mat", "a dog ran", "the dog sat", "a cat ran on a mat", "the mat", "dog", "a cat sat"]
CONFIG = {"decoder_start_token_id": 0, "vocab_size": len(WORDS), "eos_token_id": SEP,
          "label2id": {"LABEL_0": 0, "LABEL_1": 1}}


def write_tokenizer(directory: Path) -> Path:
    tokenizers = tokenizers_module()
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(ID, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


def ids(text: str) -> list[int]:
    return [CLS] + [ID[word] for word in text.split()] + [SEP]


def rows() -> dict[str, list[Any]]:
    """Every conventional column, one row per text."""
    return {"text": TEXTS, "pair": TEXTS[::-1], "label": [index % 2 for index in range(len(TEXTS))],
            "target": TEXTS[1:] + TEXTS[:1], "tokens": [text.split() for text in TEXTS],
            "ner_tags": [[position % 2 for position in range(len(text.split()))] for text in TEXTS],
            "idx": list(range(len(TEXTS)))}


def training_classes() -> list[tuple[str, str]]:
    return [(name, class_name) for name, family in FAMILIES.items()
            for class_name in family.model_family.training_classes()]


def columns_of(family_name: str, class_name: str, lengths: dict[str, int] | None = None,
               **names: str) -> Columns:
    family = FAMILIES[family_name]
    info = family.model_family.definition.classes[class_name]
    return Columns(family.model_family.input_specs(class_name), info.causal_lm, class_name,
                   lengths or dict(family.train_lengths), CONFIG, names)


def written(columns: Columns, split: Any, tokenizer: Path, tmp_path: Path, seed: int = 0) -> list[dict[str, Any]]:
    out = tmp_path / "examples.jsonl"
    write_examples(columns, split, tokenizer, "--dataset d", seed, out)
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize(("family_name", "class_name"), training_classes())
def test_every_training_class_reads_its_columns(tmp_path: Path, family_name: str, class_name: str) -> None:
    """The examples a text dataset gives every class the recipes train are what the ranks' reader accepts, or the
    class has no text convention (several label inputs) and says so in one line."""
    columns = columns_of(family_name, class_name, {name: 8 for name in FAMILIES[family_name].train_lengths})
    tokenizer = write_tokenizer(tmp_path / "tok")
    split = datasets.Dataset.from_dict(rows())
    if columns.kind == "pre-tokenized":
        with pytest.raises(UserError, match="which no text column gives"):
            written(columns, split, tokenizer, tmp_path)
        return
    out = tmp_path / "examples.jsonl"
    write_examples(columns, split, tokenizer, "--dataset d", 0, out)
    family = FAMILIES[family_name]
    cfg = family.make_config(family.configs[0])
    cfg.decoder_start_token_id, cfg.eos_token_id, cfg.pad_token_id = 0, SEP, 0
    specs = family.model_family.input_specs(class_name)
    micro_batch = MicroBatch(PER_MICRO_BATCH, columns.lengths)
    assert read_dataset(out, specs, cfg, micro_batch, 1).count >= 1


def test_each_kind_of_class_gets_its_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokenizer = write_tokenizer(tmp_path / "tok")
    split = datasets.Dataset.from_dict(rows())
    kinds = {columns_of(*case).kind: case for case in training_classes()}
    assert {"causal-lm", "sequence-classification", "seq2seq", "token-classification", "masked-lm"} <= set(kinds)
    long = {name: 64 for name in ("sequence", "source", "target")}

    sequence = written(columns_of(*kinds["sequence-classification"], long), split, tokenizer, tmp_path)
    assert [example["input_ids"] for example in sequence] == [ids(text) for text in TEXTS]
    assert [example["labels"] for example in sequence] == rows()["label"]
    assert "columns not used by the plan's" in capsys.readouterr().err  # pair, target, tokens, ner_tags, idx

    pairs = written(columns_of(*kinds["sequence-classification"], long, text_pair_column="pair"), split, tokenizer,
                    tmp_path)
    assert pairs[1]["input_ids"] == ids(TEXTS[1]) + ids(TEXTS[-2])[1:]
    if "token_type_ids" in columns_of(*kinds["sequence-classification"]).by_name:
        assert pairs[1]["token_type_ids"] == [0] * len(ids(TEXTS[1])) + [1] * (len(ids(TEXTS[-2])) - 1)

    seq2seq = written(columns_of(*kinds["seq2seq"], long), split, tokenizer, tmp_path)
    for example, target in zip(seq2seq, rows()["target"]):
        assert example["labels"] == ids(target)
        if "decoder_input_ids" in example:  # stock's shift right, decoder_start_token_id first
            assert example["decoder_input_ids"] == [CONFIG["decoder_start_token_id"]] + ids(target)[:-1]

    tagged = written(columns_of(*kinds["token-classification"], long), split, tokenizer, tmp_path)
    for example, tags in zip(tagged, rows()["ner_tags"]):
        assert example["labels"] == [IGNORED] + tags + [IGNORED]  # one token per word here; specials ignored

    causal = written(columns_of(*kinds["causal-lm"], {"sequence": 5}), split, tokenizer, tmp_path)
    packed = pack_lines(TEXTS, tokenizers_module().Tokenizer.from_file(str(tokenizer / "tokenizer.json")),
                        tokenizer, 5, SEP, "t")
    assert [example["input_ids"] for example in causal] == packed  # as --text packs the same lines
    assert all(example["labels"] == example["input_ids"] for example in causal)


def test_masked_lm_masks_as_bert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """15 % of the non-special tokens are predicted, 80 % of those masked, 10 % replaced; drawn from --seed."""
    tokenizer = write_tokenizer(tmp_path / "tok")
    masked_lm = next(case for case in training_classes() if columns_of(*case).kind == "masked-lm")
    texts = [" ".join(WORDS[5 + (i * 7 + j) % 8] for j in range(40)) for i in range(200)]
    split = datasets.Dataset.from_dict({"text": texts})
    examples = written(columns_of(*masked_lm, {"sequence": 64}), split, tokenizer, tmp_path, seed=3)
    assert "masked once with --seed 3 (static masking" in capsys.readouterr().out
    chosen = masked = kept = 0
    for example, text in zip(examples, texts):
        original = ids(text)
        assert example["labels"][0] == example["labels"][-1] == IGNORED  # [CLS], [SEP] never predicted
        for position, label in enumerate(example["labels"]):
            if label == IGNORED:
                assert example["input_ids"][position] == original[position]
                continue
            assert label == original[position]
            chosen += 1
            masked += example["input_ids"][position] == ID["[MASK]"]
            kept += example["input_ids"][position] == original[position]
    tokens = 200 * 40
    assert abs(chosen / tokens - 0.15) < 0.02, chosen / tokens
    assert abs(masked / chosen - 0.8) < 0.05 and abs(kept / chosen - 0.1) < 0.04, (masked / chosen, kept / chosen)
    assert written(columns_of(*masked_lm, {"sequence": 64}), split, tokenizer, tmp_path, seed=3) == examples
    assert written(columns_of(*masked_lm, {"sequence": 64}), split, tokenizer, tmp_path, seed=4) != examples


def test_truncation_and_pre_tokenized_columns_are_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokenizer = write_tokenizer(tmp_path / "tok")
    sequence = next(case for case in training_classes() if columns_of(*case).kind == "sequence-classification")
    cut = written(columns_of(*sequence, {"sequence": 4}), datasets.Dataset.from_dict(rows()), tokenizer, tmp_path)
    assert cut[0]["input_ids"] == [CLS, ID["the"], ID["cat"], SEP]  # truncated, its special tokens kept
    assert "5 texts longer than the plan's lengths (4 tokens) were truncated" in capsys.readouterr().err
    given = {"input_ids": [[5, 6, 7], [8, 9]], "labels": [1, 0], "idx": [0, 1]}
    examples = written(columns_of(*sequence), datasets.Dataset.from_dict(given), tokenizer, tmp_path)
    assert examples == [{"input_ids": [5, 6, 7], "labels": 1}, {"input_ids": [8, 9], "labels": 0}]
    assert f"columns not used by the plan's {sequence[1]}: idx" in capsys.readouterr().err


def test_the_formats_users_have_read_alike_and_bad_ones_are_one_line(tmp_path: Path) -> None:
    table = datasets.Dataset.from_dict({"text": TEXTS, "label": rows()["label"]})
    whole = datasets.DatasetDict({"train": table, "validation": table.select(range(3))})
    whole.save_to_disk(str(tmp_path / "dict"))
    table.save_to_disk(str(tmp_path / "one"))
    table.to_parquet(str(tmp_path / "t.parquet"))
    table.to_json(str(tmp_path / "t.jsonl"))
    table.to_csv(str(tmp_path / "t.csv"), index=False)
    cache = tmp_path / "cache"
    expected = table.to_list()
    for path, split in [("dict", None), ("one", None), ("t.parquet", None), ("t.jsonl", None), ("t.csv", "train")]:
        assert load_split(tmp_path / path, split, "--dataset", "train", cache)[0].to_list() == expected, path
    assert load_split(tmp_path / "dict", None, "--dataset", "train", cache)[1] == "train"
    assert load_split(tmp_path / "dict", "validation", "--dataset", "train", cache)[0].to_list() == expected[:3]
    with pytest.raises(UserError, match=r"has no split 'test' \(its splits: train, validation\)"):
        load_split(tmp_path / "dict", "test", "--dataset", "train", cache)
    with pytest.raises(UserError, match="is one dataset, not a DatasetDict"):
        load_split(tmp_path / "one", "train", "--dataset", "train", cache)
    with pytest.raises(UserError, match="one file, one split"):
        load_split(tmp_path / "t.parquet", "validation", "--dataset", "train", cache)
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(UserError, match="expected a save_to_disk directory or a"):
        load_split(tmp_path / "t.txt", None, "--dataset", "train", cache)
    (tmp_path / "bare").mkdir()
    with pytest.raises(UserError, match="is not a directory save_to_disk wrote"):
        load_split(tmp_path / "bare", None, "--dataset", "train", cache)
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(UserError, match="is not readable as parquet"):
        load_split(tmp_path / "bad.parquet", None, "--dataset", "train", cache)
    (tmp_path / "bad.jsonl").write_text('{"text": "a"\n')
    with pytest.raises(UserError, match="is not readable as json: .+") as error:
        load_split(tmp_path / "bad.jsonl", None, "--dataset", "train", cache)
    assert "An error occurred while generating" not in str(error.value)  # the parser's own words, not the wrapper's


# kind -> (family, class, test config, first block of stage 1, the dataset's form, evaluated)
RUNS = {"seq2seq": ("t5", "T5ForConditionalGeneration", "2layer-gelu-tied", "encoder.block.1", "dict", True),
        "causal-lm": ("gpt2", "GPT2LMHeadModel", "3layer-tied-relu-inner", "transformer.h.2", "jsonl", True),
        "token-classification": ("bert", "BertForTokenClassification", "2layer-untied-relu", "bert.encoder.layer.0",
                                 "parquet", False)}


@pytest.mark.parametrize("kind", RUNS)
def test_a_dataset_trains_as_its_examples_written_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """2 stages, --epochs 1 over a dataset on disk (evaluated: a DatasetDict's validation split, or a file as
    --eval-dataset), tokenized with the checkpoint's own tokenizer.json: equal to one process on the examples the
    conversion writes; the eval loss equal to stock eval mode's on the saved weights."""
    monkeypatch.setenv("OMP_NUM_THREADS", str(RANK_THREADS))  # the ranks' count, as the reference runs with
    family_name, class_name, config_name, split, form, evaluated = RUNS[kind]
    family = class_family(FAMILIES[family_name], class_name)
    checkpoint = tmp_path / "checkpoint"
    cfg = train_runs.save_checkpoint(family, config_name, checkpoint)
    write_tokenizer(checkpoint)  # the checkpoint's own tokenizer: no --tokenizer
    plan = tmp_path / "plan.json"
    train_runs.write_plan(family, cfg, split, "gpipe", plan)
    table = datasets.Dataset.from_dict({name: values for name, values in rows().items() if name != "label"})
    dataset = {"dict": tmp_path / "dataset", "jsonl": tmp_path / "rows.jsonl", "parquet": tmp_path / "rows.parquet"}
    if form == "dict":
        datasets.DatasetDict({"train": table, "validation": table}).save_to_disk(str(dataset[form]))
        evaluation = ["--eval-split", "validation"]
    elif form == "jsonl":
        table.to_json(str(dataset[form]))
        evaluation = ["--eval-dataset", str(dataset[form])]
    else:
        table.to_parquet(str(dataset[form]))
        evaluation = []
    out = tmp_path / "out"
    assert main(["--plan", str(plan), "--checkpoint", str(checkpoint), "--dataset", str(dataset[form]),
                 "--epochs", "1", *evaluation, "--save", str(out), *OPTIONS]) == 0
    _, _, _, specs, micro_batch = plan_model(read_plan(plan))
    info = family.model_family.definition.classes[class_name]
    columns = Columns(specs, info.causal_lm, class_name, dict(micro_batch.lengths),
                      json.loads((checkpoint / "config.json").read_text()), {})
    examples = tmp_path / "examples.jsonl"
    count = write_examples(columns, table, checkpoint, "d", 0, examples)
    assert f"examples ({kind})" in capsys.readouterr().out
    steps = math.ceil(count / (PER_MICRO_BATCH * MICRO_BATCHES))
    expected = train_runs.reference(family, checkpoint, plan, examples, steps)
    different = train_runs.saved_differences(family, out, expected)
    assert different == {}, sorted(different.items(), key=lambda item: -item[1])[:5]
    logged = [json.loads(line) for line in (out / METRICS).read_text().splitlines()]
    assert logged[-1]["step"] == steps
    if evaluated:
        assert logged[-1]["eval_examples"] == count
        assert logged[-1]["eval_loss"] == stock_eval_loss(out, plan, examples, family)  # bit for bit
    else:
        assert "eval_loss" not in logged[-1]


def test_a_classifier_trains_from_parquet_sentence_pairs_and_label_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", str(RANK_THREADS))
    class_name = "BertForSequenceClassification"
    _, (family, plan, _, micro_batches) = head_case(class_name, tmp_path, 2)
    checkpoint = tmp_path / "checkpoint"
    tokenizer = write_tokenizer(tmp_path / "tok")
    names = [f"LABEL_{index % 2}" for index in range(len(TEXTS))]
    datasets.Dataset.from_dict({"sentence1": TEXTS, "sentence2": TEXTS[::-1], "label": names}).to_parquet(
        str(tmp_path / "pairs.parquet"))
    base = ["--plan", str(plan), "--checkpoint", str(checkpoint), "--steps", "2"]

    def refused(*given: str) -> str:
        code, err = main([*base, *given]), capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and err.startswith("train-model: error: "), err
        return err

    pairs = ["--dataset", str(tmp_path / "pairs.parquet"), "--tokenizer", str(tokenizer)]
    assert "has no column 'text'" in refused(*pairs)
    assert "--eval-split NAME is a split of --dataset PATH" in refused("--data", str(plan), "--eval-split", "v")
    (tmp_path / "ids.csv").write_text('input_ids,labels\n"[5, 6]",1\n')  # a CSV holds the list as text
    assert "row 0: input_ids must be a list of integers" in refused("--dataset", str(tmp_path / "ids.csv"))
    assert "one of them" in refused(*pairs, "--data", str(plan))
    assert "names a column of --dataset" in refused("--data", str(plan), "--label-column", "y")
    assert "one file, one split (train): it has no split 'test'" in refused(*pairs, "--eval-split", "test")
    assert main([*base, *pairs, "--text-column", "sentence1", "--text-pair-column", "sentence2",
                 "--save", str(tmp_path / "out"), *OPTIONS]) == 0
    config = json.loads((checkpoint / "config.json").read_text())
    _, _, _, _, micro_batch = plan_model(read_plan(plan))
    examples = tmp_path / "pairs.jsonl"
    table = datasets.Dataset.from_dict({"sentence1": TEXTS, "sentence2": TEXTS[::-1], "label": names})
    columns = Columns(family.model_family.input_specs(class_name), False, class_name, dict(micro_batch.lengths),
                      config, {"text_column": "sentence1", "text_pair_column": "sentence2"})
    write_examples(columns, table, tokenizer, "d", 0, examples)
    written_labels = [json.loads(line)["labels"] for line in examples.read_text().splitlines()]
    assert written_labels == [config["label2id"][name] for name in names]
    expected = train_runs.reference(family, checkpoint, plan, examples, 2, micro_batches)
    different = train_runs.saved_differences(family, tmp_path / "out", expected)
    assert different == {}, sorted(different.items(), key=lambda item: -item[1])[:5]

