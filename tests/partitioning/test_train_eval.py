"""train-model --eval-data: the mean loss over an eval file, forward only through the pipeline, in eval mode.

A T5 with dropout 0.1 (so train and eval mode differ, and the ranks draw dropout masks) is trained 2 steps on 2
stages, evaluated after each; each logged eval loss must equal stock eval mode's on the weights saved at that
step (stock ``from_pretrained`` of ``checkpoint-1/`` and of the final directory), micro-batch by micro-batch and
weighted as partitioning/train/evaluate.py says, the last micro-batch padded.  The same run without evaluation
must save the same weights: evaluating draws nothing and touches no training state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from support import train_runs
from support.model_families import FAMILIES
from support.threads import threads
from support.train_runs import OPTIONS, PER_MICRO_BATCH, write_data

from partitioning.files import read_plan
from partitioning.train.cli import main
from partitioning.train.data import IGNORED, read_dataset
from partitioning.train.layout import METRICS
from partitioning.train.stage import plan_model

FAMILY = FAMILIES["t5"]
EXAMPLES = 7  # 2 rounds of 2 micro-batches of 2: the last micro-batch holds 1 example and 1 of padding


def stock_eval_loss(directory: Path, plan: Path, data: Path, family: Any = FAMILY) -> float:
    """Stock eval mode on the saved weights: micro-batches of the plan's size in the file's order, the last filled
    with the first example, its labels ignored; the losses weighted by the real examples each holds."""
    _, _, cfg, specs, micro_batch = plan_model(read_plan(plan))
    read = read_dataset(data, specs, cfg, micro_batch, 1)
    tensors = read.tensors
    model = train_runs.load_stock(family, directory).eval()
    total, weight = 0.0, 0
    with threads(1), torch.no_grad():
        for start in range(0, read.count, PER_MICRO_BATCH):
            real = min(PER_MICRO_BATCH, read.count - start)
            batch = {name: tensor[start:start + real] for name, tensor in tensors.items()}
            if real < PER_MICRO_BATCH:
                filler = {name: tensor[:1].clone() for name, tensor in tensors.items()}
                filler["labels"].fill_(IGNORED)
                batch = {name: torch.cat([batch[name], filler[name]]) for name in batch}
            total += model(**batch).loss.item() * real
            weight += real
    return total / weight


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("eval")
    cfg = FAMILY.make_config("2layer-gelu-tied")
    cfg.dropout_rate = 0.1
    torch.manual_seed(0)
    train_runs.stock_class(FAMILY)(cfg).save_pretrained(root / "t5")
    train_runs.write_plan(FAMILY, cfg, "encoder.block.1", "1f1b", root / "plan.json")
    write_data(root / "data.jsonl", root / "plan.json")
    write_data(root / "eval.jsonl", root / "plan.json", count=EXAMPLES, seed=1)
    common = ["--plan", str(root / "plan.json"), "--checkpoint", str(root / "t5"), "--data",
              str(root / "data.jsonl"), "--steps", "2", *OPTIONS]
    assert main([*common, "--save", str(root / "evaluated"), "--eval-data", str(root / "eval.jsonl"),
                 "--eval-every", "1", "--save-every", "1", "--save-total-limit", "1"]) == 0
    assert main([*common, "--save", str(root / "plain")]) == 0
    return {"root": root, "plan": root / "plan.json", "eval": root / "eval.jsonl"}


def test_each_eval_loss_is_stock_eval_mode_on_that_step_s_weights(runs: dict[str, Path]) -> None:
    records = [json.loads(line) for line in (runs["root"] / "evaluated" / METRICS).read_text().splitlines()]
    assert [(r["step"], r["eval_examples"]) for r in records] == [(1, EXAMPLES), (2, EXAMPLES)], records
    saved = {1: runs["root"] / "evaluated" / "checkpoint-1", 2: runs["root"] / "evaluated"}
    for record in records:
        expected = stock_eval_loss(saved[record["step"]], runs["plan"], runs["eval"])
        assert record["eval_loss"] == expected, (record, expected)
    assert records[0]["eval_loss"] != records[1]["eval_loss"]  # the weights changed between them


def test_evaluating_leaves_training_as_it_was(runs: dict[str, Path]) -> None:
    evaluated = train_runs.load_stock(FAMILY, runs["root"] / "evaluated").state_dict()
    plain = train_runs.load_stock(FAMILY, runs["root"] / "plain").state_dict()
    assert evaluated.keys() == plain.keys()
    assert [key for key in plain if not torch.equal(plain[key], evaluated[key])] == []


def test_replicas_evaluate_their_shares_and_the_loss_is_the_whole_file_s(tmp_path: Path) -> None:
    """GPT-2 with dropout on 2 stages x 2 replicas: each replica takes its share of each round, the first
    replica's last stage weighs every micro-batch in the file's order (7 examples: rounds of 8)."""
    family = FAMILIES["gpt2"]
    cfg = family.make_config("3layer-tied-relu-inner")
    cfg.resid_pdrop = cfg.embd_pdrop = cfg.attn_pdrop = 0.1
    torch.manual_seed(0)
    train_runs.stock_class(family)(cfg).save_pretrained(tmp_path / "gpt2")
    train_runs.write_plan(family, cfg, "transformer.h.2", "1f1b", tmp_path / "plan.json")
    write_data(tmp_path / "data.jsonl", tmp_path / "plan.json", count=8)
    write_data(tmp_path / "eval.jsonl", tmp_path / "plan.json", count=EXAMPLES, seed=1)
    assert main(["--plan", str(tmp_path / "plan.json"), "--checkpoint", str(tmp_path / "gpt2"), "--data",
                 str(tmp_path / "data.jsonl"), "--steps", "1", *OPTIONS, "--data-parallel", "2",
                 "--eval-data", str(tmp_path / "eval.jsonl"), "--save", str(tmp_path / "out")]) == 0
    (record,) = [json.loads(line) for line in (tmp_path / "out" / METRICS).read_text().splitlines()]
    expected = stock_eval_loss(tmp_path / "out", tmp_path / "plan.json", tmp_path / "eval.jsonl", family)
    assert (record["eval_loss"], record["eval_examples"]) == (expected, EXAMPLES), (record, expected)


def test_eval_every_needs_eval_data(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--plan", "p.json", "--checkpoint", "c", "--data", "d", "--steps", "1", "--eval-every", "2"]) == 2
    assert "--eval-every N evaluates --eval-data FILE" in capsys.readouterr().err


def test_a_bad_eval_file_is_one_line_before_any_rank_starts(runs: dict[str, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    bad = runs["root"] / "bad.jsonl"
    bad.write_text('{"input_ids": [5, 6], "decoder_input_ids": [1], "labels": [1], "source": "x"}\n')
    code = main(["--plan", str(runs["plan"]), "--checkpoint", str(runs["root"] / "t5"), "--data",
                 str(runs["root"] / "data.jsonl"), "--steps", "1", "--eval-data", str(bad)])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and f"{bad} line 1: unknown field 'source'" in err, err
    assert "starting" not in out, out
