"""train-model equals one process: N steps from a saved stock checkpoint, AdamW, warm-up, clipping, a data file.

For every family with a training class (transformers 4.5.1, tiny configs without dropout), a stock model
is saved with save_pretrained, planned into 2 stages and trained with GPipe and 1F1B, and into 3 stages with
one of them (every family in one 3-rank launch, both schedules among them), on CPU gloo ranks (several runs
per torchrun launch, see support/train_worker.py).  Every other class that trains (the heads: sequence and
token classification, BERT's masked LM) runs in its family's 2-rank launch with one schedule and in the 3-rank
launch with the other.  The saved directory must load with stock from_pretrained of that class (no missing or
unexpected keys) and hold weights torch.equal to the same steps
in one process: the stock model, torch.optim.AdamW, transformers' own warm-up schedule, clip_grad_norm_.
A resumed run (1..n, save, resume to 2n) must equal 2n steps in one go, and each rank must read only its
own stage's tensors from the checkpoint, every other stage staying on ``meta``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from support import train_runs
from support.heads import class_family
from support.model_families import FAMILIES
from support.train_runs import (
    HEAD_CASES,
    MICRO_BATCHES,
    OPTIONS,
    OTHER,
    PER_MICRO_BATCH,
    STEPS,
    assert_stage_only,
    launch,
    write_data,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from partitioning.train.data import read_dataset
from partitioning.train.layout import METRICS
from partitioning.train.save import COMPANIONS
from partitioning.train.stage import plan_model

__all__ = ["MICRO_BATCHES", "OPTIONS", "PER_MICRO_BATCH", "STEPS", "assert_stage_only", "launch", "write_data"]
# family -> (test config, [(schedule, first blocks of stages 1..K-1)])
CASES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "t5": ("2layer-gelu-tied", [("gpipe", "encoder.block.1"), ("1f1b", "decoder.embed")]),
    "gpt2": ("3layer-tied-relu-inner", [("gpipe", "transformer.h.2"), ("1f1b", "lm_head")]),
    "bert": ("1layer-tied", [("gpipe", "bert.encoder.layer.0"), ("1f1b", "cls")]),
    "roberta": ("1layer-tied", [("1f1b", "roberta.encoder.layer.0"), ("gpipe", "lm_head")]),
    "bart": ("2layer-scaled-3dec", [("gpipe", "decoder.embed"), ("1f1b", "model.decoder.layers.1")]),
}
# family -> (schedule, first blocks of stages 1 and 2) of the 3-stage run: GPipe and 1F1B in turn
THREE_STAGES = {"t5": ("gpipe", "encoder.block.1,lm_head"), "gpt2": ("1f1b", "transformer.h.1,lm_head"),
                "bert": ("gpipe", "bert.encoder.layer.0,cls"), "roberta": ("1f1b", "roberta.encoder.layer.0,lm_head"),
                "bart": ("gpipe", "model.encoder.layers.1,model.decoder.layers.2")}
TIED_BOUND = 1e-5  # --tied-sum allreduce, 3 AdamW steps at lr 0.01 (measured: 35 tensors differ, at most 6.0e-8)


# The shared helpers of support/train_runs.py on the 4.5.1 families (the release in .venv), by name.
def stock_class(family: str) -> Any:
    return train_runs.stock_class(FAMILIES[family])


def save_checkpoint(family: str, directory: Path) -> Any:
    return train_runs.save_checkpoint(FAMILIES[family], CASES[family][0], directory)


def write_plan(family: str, cfg: Any, split: str, schedule: str, path: Path, tied_sum: str = "ordered",
               micro_batches: int = MICRO_BATCHES) -> None:
    train_runs.write_plan(FAMILIES[family], cfg, split, schedule, path, tied_sum, micro_batches)


def reference(family: str, checkpoint: Path, plan: Path, data: Path, steps: int,
              micro_batches: int = MICRO_BATCHES, bf16: bool = False) -> torch.nn.Module:
    return train_runs.reference(FAMILIES[family], checkpoint, plan, data, steps, micro_batches, bf16)


def saved_differences(family: str, saved: Path, expected: torch.nn.Module) -> dict[str, float]:
    return train_runs.saved_differences(FAMILIES[family], saved, expected)


def assert_saved_equals(family: str, saved: Path, expected: torch.nn.Module) -> None:
    different = saved_differences(family, saved, expected)
    assert different == {}, sorted(different.items(), key=lambda item: -item[1])[:5]


def head_case(class_name: str, root: Path, stages: int) -> tuple[list[str], tuple[Any, Path, Path, int]]:
    """A run of ``class_name`` (:data:`HEAD_CASES`) on ``stages`` stages under ``root``: its train-model command line,
    and what the one-process reference takes (its family, checkpoint, plan, micro-batches)."""
    family_name, config, schedule, split, three = HEAD_CASES[class_name]
    family = class_family(FAMILIES[family_name], class_name)
    schedule, split = (schedule, split) if stages == 2 else (OTHER[schedule], three)
    micro_batches = 3 if schedule == "1f1b" and stages == 3 else MICRO_BATCHES  # 1F1B: as many as stages
    cfg = train_runs.save_checkpoint(family, config, root / "checkpoint")
    plan, data = root / "plan.json", root / "data.jsonl"
    train_runs.write_plan(family, cfg, split, schedule, plan, micro_batches=micro_batches)
    write_data(data, plan)
    return (["--plan", str(plan), "--checkpoint", str(root / "checkpoint"), "--data", str(data), "--steps", str(STEPS),
             "--save", str(root / "out"), *OPTIONS], (family, plan, data, micro_batches))


def assert_head_equal(root: Path, expected: tuple[Any, Path, Path, int]) -> None:
    """The head's saved run (stock from_pretrained of its class) equals the same steps in one process."""
    family, plan, data, micro_batches = expected
    want = train_runs.reference(family, root / "checkpoint", plan, data, STEPS, micro_batches)
    different = train_runs.saved_differences(family, root / "out", want)
    assert different == {}, sorted(different.items(), key=lambda item: -item[1])[:5]


def assert_loss_close(family: str, bf16: Path, fp32: Path, plan: Path, data: Path) -> None:
    """The bf16 run's weights give a loss (fp32, on the first batch) within 1 % of the fp32 run's."""
    from partitioning.files import read_plan

    _, _, cfg, specs, micro_batch = plan_model(read_plan(plan))
    batch = read_dataset(data, specs, cfg, micro_batch, PER_MICRO_BATCH).batch(0, PER_MICRO_BATCH, 0)
    with torch.no_grad():
        losses = [float(stock_class(family).from_pretrained(path)(**batch).loss) for path in (bf16, fp32)]
    assert abs(losses[0] - losses[1]) <= 0.01 * abs(losses[1]), losses


def assert_bf16_files(saved: Path) -> None:
    from safetensors import safe_open

    for shard in sorted(saved.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as handle:
            dtypes = {handle.get_slice(key).get_dtype() for key in handle.keys()}
            assert {dtype for dtype in dtypes if "F" in dtype} == {"BF16"}, (shard, dtypes)  # masks stay U8


def test_every_class_that_trains_runs() -> None:
    """The default classes (CASES) and HEAD_CASES are every class whose output is its loss, of every family."""
    for family in CASES:
        definition = FAMILIES[family].model_family.definition
        trains = {name for name, info in definition.classes.items() if info.trains}
        assert trains == {definition.default_class, *(name for name, case in HEAD_CASES.items() if case[0] == family)}


@pytest.mark.parametrize("family", list(CASES))
def test_train_model_equals_one_process_training(tmp_path: Path, family: str) -> None:
    checkpoint = tmp_path / "checkpoint"
    cfg = save_checkpoint(family, checkpoint)
    cases, expected = {}, {}
    for schedule, split in CASES[family][1]:
        plan, data = tmp_path / f"{schedule}.plan.json", tmp_path / f"{schedule}.jsonl"
        write_plan(family, cfg, split, schedule, plan)
        write_data(data, plan)
        cases[schedule] = ["--plan", str(plan), "--checkpoint", str(checkpoint), "--data", str(data), "--steps",
                           str(STEPS), "--save", str(tmp_path / f"{schedule}.out"), *OPTIONS]
        expected[schedule] = (plan, data)
    if family in ("gpt2", "t5"):  # --dtype bf16: the forwards under bf16 autocast
        cases["bf16"] = [*cases["gpipe"][:-len(OPTIONS) - 1], str(tmp_path / "bf16.out"), *OPTIONS, "--dtype", "bf16"]
    if family == "gpt2":  # a plan made with --tied-sum allreduce (train-model runs the plan's choice): the tied
        # wte / lm_head copies add their accumulated gradients
        plan = tmp_path / "allreduce.plan.json"
        write_plan(family, cfg, CASES[family][1][0][1], "gpipe", plan, tied_sum="allreduce")
        cases["allreduce"] = ["--plan", str(plan), *cases["gpipe"][2:-len(OPTIONS) - 1], str(tmp_path / "allreduce.out"),
                              *OPTIONS]
        # a bf16 checkpoint: trained in fp32, saved in bf16; 1..2, save, resume to 4 continues the fp32 weights
        stock_class(family).from_pretrained(checkpoint).to(torch.bfloat16).save_pretrained(tmp_path / "bf16.in")
        plan, data = expected["gpipe"]
        common = ["--plan", str(plan), "--data", str(data), *OPTIONS]
        cases["bf16-half"] = [*common, "--checkpoint", str(tmp_path / "bf16.in"), "--steps", "2", "--decay-steps",
                              "4", "--save", str(tmp_path / "bf16.half")]
        cases["bf16-resumed"] = [*common, "--resume", str(tmp_path / "bf16.half"), "--steps", "4", "--save",
                                 str(tmp_path / "bf16.resumed")]
    if family == "t5":  # resume: 1..n, save, resume to 2n equals 2n in one go (n = 2)
        plan, data = expected["gpipe"]
        for name in COMPANIONS:  # a tokenizer's files and generation defaults, as a user's checkpoint has them
            (checkpoint / name).write_text(json.dumps({"file": name}))
        common = ["--plan", str(plan), "--data", str(data), *OPTIONS]
        cases["half"] = [*common, "--checkpoint", str(checkpoint), "--steps", "2", "--decay-steps", "4", "--save",
                         str(tmp_path / "half")]
        cases["resumed"] = [*common, "--resume", str(tmp_path / "half"), "--steps", "4", "--save",
                            str(tmp_path / "resumed")]
        cases["whole"] = [*common, "--checkpoint", str(checkpoint), "--steps", "4", "--save", str(tmp_path / "whole"),
                          "--tensorboard", str(tmp_path / "tensorboard"), "--save-every", "1", "--save-total-limit", "2"]
    heads = {}  # the family's other training classes, one schedule each (the 3-stage run takes the other)
    for class_name in (name for name, case in HEAD_CASES.items() if case[0] == family):
        cases[class_name], heads[class_name] = head_case(class_name, tmp_path / class_name, 2)
    records = launch(2, cases, tmp_path / "records")
    for class_name, head in heads.items():
        assert_stage_only(records[class_name])
        assert_head_equal(tmp_path / class_name, head)
    for schedule, (plan, data) in expected.items():
        assert_stage_only(records[schedule])
        assert_saved_equals(family, tmp_path / f"{schedule}.out", reference(family, checkpoint, plan, data, STEPS))
    if family in ("gpt2", "t5"):
        plan, data = expected["gpipe"]
        assert_saved_equals(family, tmp_path / "bf16.out", reference(family, checkpoint, plan, data, STEPS, bf16=True))
        assert_loss_close(family, tmp_path / "bf16.out", tmp_path / "gpipe.out", plan, data)
    if family == "gpt2":
        # One process adds each micro-batch's two uses, then the micro-batches; allreduce adds each copy's
        # micro-batches, then the two copies: equal up to that float summation order, the bound tested.
        different = saved_differences(family, tmp_path / "allreduce.out", reference(family, checkpoint, plan, data,
                                                                                    STEPS))
        assert different and max(different.values()) < TIED_BOUND, different  # not the ordered sum's bits
        assert_bf16_files(tmp_path / "bf16.resumed")
        expected_model = reference(family, tmp_path / "bf16.in", plan, data, 4).to(torch.bfloat16)
        assert_saved_equals(family, tmp_path / "bf16.resumed", expected_model.float())
    if family == "t5":
        whole = stock_class(family).from_pretrained(tmp_path / "whole")
        assert_saved_equals(family, tmp_path / "resumed", whole)
        assert_metrics(tmp_path)
        assert_checkpoints(tmp_path / "whole", tmp_path / "half")
        for name in COMPANIONS:  # carried over by every save: from the checkpoint, and from the run resumed
            assert all((tmp_path / run / name).read_bytes() == (checkpoint / name).read_bytes()
                       for run in ("half", "resumed", "whole")), name
        plan, data = expected["gpipe"]
        assert_saved_equals(family, tmp_path / "whole", reference(family, checkpoint, plan, data, 4))


def assert_metrics(root: Path) -> None:
    """metrics.jsonl: one record per step, the resumed run's file its whole run (the history it continues, then its
    own steps), every number equal to the uninterrupted run's but the timings; TensorBoard holds the same losses."""
    runs = {name: [json.loads(line) for line in (root / name / METRICS).read_text().splitlines()]
            for name in ("half", "resumed", "whole")}
    assert [record["step"] for record in runs["half"]] == [1, 2]
    assert [record["step"] for record in runs["resumed"]] == [record["step"] for record in runs["whole"]] == [1, 2, 3, 4]
    exact = ("step", "loss", "lr", "grad_norm")  # clipping computes the norm: OPTIONS clip
    assert [[r[k] for k in exact] for r in runs["resumed"]] == [[r[k] for k in exact] for r in runs["whole"]]
    assert runs["resumed"][:2] == runs["half"]
    for record in runs["whole"]:
        assert len(record["peak_memory_bytes"]) == 2 and min(record["peak_memory_bytes"]) > 0, record
        assert record["tokens_per_s"] > 0 and record["memory"] == "process peak RSS"
    events = EventAccumulator(str(root / "tensorboard"))
    events.Reload()
    scalars = [(event.step, event.value) for event in events.Scalars("train/loss")]
    assert scalars == [(r["step"], torch.tensor(r["loss"], dtype=torch.float32).item()) for r in runs["whole"]]
    assert len(events.Scalars("train/peak_memory_bytes/stage_1")) == 4


def assert_checkpoints(whole: Path, half: Path) -> None:
    """--save-every 1 --save-total-limit 2 of 4 steps: checkpoint-2/ and checkpoint-3/ kept (checkpoint-1/ pruned),
    the last save in the directory itself; checkpoint-2/ is the 2-step run's save (same schedule: --decay-steps 4),
    tensor for tensor, with its history as its metrics file."""
    assert sorted(path.name for path in whole.iterdir() if path.name.startswith(("checkpoint-", ".checkpoint-"))) == [
        "checkpoint-2", "checkpoint-3"]
    kept = {key: tensor for path in sorted((whole / "checkpoint-2").glob("*.safetensors"))
            for key, tensor in load_file(path).items()}
    saved = {key: tensor for path in sorted(half.glob("*.safetensors")) for key, tensor in load_file(path).items()}
    assert sorted(kept) == sorted(saved) and all(torch.equal(kept[key], saved[key]) for key in kept)
    exact = ("step", "loss", "lr", "grad_norm")
    history = [json.loads(line) for line in (whole / "checkpoint-2" / METRICS).read_text().splitlines()]
    assert [[r[k] for k in exact] for r in history] == [[r[k] for k in exact] for r in
                                                        map(json.loads, (half / METRICS).read_text().splitlines())]
    _, info = stock_class("t5").from_pretrained(whole / "checkpoint-3", output_loading_info=True)
    assert not any(info.values()), info


def test_three_stages(tmp_path: Path) -> None:
    """Every family at 3 stages in one 3-rank launch, GPipe and 1F1B in turn; each split puts the tied embedding on
    rank 0 and the head on rank 2 (T5 and BART: the decoder's embedding on rank 1), the weight read by each.
    Every other training class in the same launch (:data:`HEAD_CASES`)."""
    cases, expected = {}, {}
    for family, (schedule, split) in THREE_STAGES.items():
        root = tmp_path / family
        cfg = save_checkpoint(family, root / "checkpoint")
        micro_batches = 3 if schedule == "1f1b" else MICRO_BATCHES  # 1F1B needs as many as there are stages
        plan, data = root / "plan.json", root / "data.jsonl"
        write_plan(family, cfg, split, schedule, plan, micro_batches=micro_batches)
        write_data(data, plan)
        cases[family] = ["--plan", str(plan), "--checkpoint", str(root / "checkpoint"), "--data", str(data),
                         "--steps", str(STEPS), "--save", str(root / "out"), *OPTIONS]
        expected[family] = (plan, data, micro_batches)
    heads = {}
    for class_name in HEAD_CASES:  # every other training class, under the schedule its 2-stage run did not take
        cases[class_name], heads[class_name] = head_case(class_name, tmp_path / class_name, 3)
    records = launch(3, cases, tmp_path / "records")
    for class_name, head in heads.items():
        assert_stage_only(records[class_name])
        assert_head_equal(tmp_path / class_name, head)
    for family, (plan, data, micro_batches) in expected.items():
        ranks = sorted(records[family], key=lambda record: record["rank"])
        assert_stage_only(ranks)
        assert set(ranks[0]["own"]) & set(ranks[2]["own"]), family  # the tied weight: on the first and last rank
        root = tmp_path / family
        assert_saved_equals(family, root / "out", reference(family, root / "checkpoint", plan, data, STEPS,
                                                            micro_batches))
