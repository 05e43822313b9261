"""train-model equals one process: N steps from a saved stock checkpoint, AdamW, warm-up, clipping, a data file.

For every family with a training class (transformers 4.5.1, tiny configs without dropout), a stock model
is saved with save_pretrained, planned into 2 stages (T5 also 3), and trained with GPipe and 1F1B on CPU
gloo ranks (several runs per torchrun launch, see support/train_worker.py).  The saved directory must load
with stock from_pretrained (no missing or unexpected keys) and hold weights torch.equal to the same steps
in one process: the stock model, torch.optim.AdamW, transformers' own warm-up schedule, clip_grad_norm_.
A resumed run (1..n, save, resume to 2n) must equal 2n steps in one go, and each rank must read only its
own stage's tensors from the checkpoint, every other stage staying on ``meta``.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from support import REPO, SUPPORT, TORCHRUN
from support.model_families import FAMILIES
from support.threads import threads

from families.models import MicroBatch
from partitioning.cost.chain import family_chain
from partitioning.solve.partition import Settings, build_plan
from partitioning.train.data import read_dataset
from partitioning.train.stage import plan_model

PER_MICRO_BATCH, MICRO_BATCHES, STEPS = 2, 2, 3
# family -> (test config, [(schedule, first blocks of stages 1..K-1)])
CASES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "t5": ("2layer-gelu-tied", [("gpipe", "encoder.block.1"), ("1f1b", "decoder.embed")]),
    "gpt2": ("3layer-tied-relu-inner", [("gpipe", "transformer.h.2"), ("1f1b", "lm_head")]),
    "bert": ("1layer-tied", [("gpipe", "bert.encoder.layer.0"), ("1f1b", "cls")]),
    "roberta": ("1layer-tied", [("1f1b", "roberta.encoder.layer.0"), ("gpipe", "lm_head")]),
    "bart": ("2layer-scaled-3dec", [("gpipe", "decoder.embed"), ("1f1b", "model.decoder.layers.1")]),
}
TIED_BOUND = 1e-5  # --tied-sum allreduce, 3 AdamW steps at lr 0.01 (measured: 35 tensors differ, at most 6.0e-8)
OPTIONS = ["--lr", "0.01", "--weight-decay", "0.01", "--warmup-steps", "2", "--decay", "cosine", "--clip-grad", "0.01"]  # small enough to clip every step


def without_dropout(cfg: Any) -> Any:
    for key, value in cfg.to_dict().items():
        if isinstance(value, float) and ("dropout" in key or key.endswith("pdrop")):
            setattr(cfg, key, 0.0)
    return cfg


def stock_class(family: str) -> Any:
    return getattr(transformers, FAMILIES[family].model_family.definition.default_class)


def save_checkpoint(family: str, directory: Path) -> Any:
    cfg = without_dropout(FAMILIES[family].make_config(CASES[family][0]))
    torch.manual_seed(0)
    stock_class(family)(cfg).save_pretrained(directory)
    return cfg


def write_plan(family: str, cfg: Any, split: str, schedule: str, path: Path, tied_sum: str = "ordered") -> None:
    models = FAMILIES[family].model_family
    class_name = models.definition.default_class
    micro_batch = MicroBatch(PER_MICRO_BATCH, FAMILIES[family].train_lengths)
    chain = family_chain(models, class_name, cfg, micro_batch)
    names = [block.name for block in chain.blocks]
    starts = [0] + [names.index(name) for name in split.split(",")]
    plan = build_plan(chain.blocks, [(a, b - 1) for a, b in zip(starts, starts[1:] + [len(names)])],
                      Settings(micro_batches=MICRO_BATCHES, schedule=schedule, tied_sum=tied_sum), {},
                      values=chain.values)
    plan.model = models.describe(class_name, cfg, micro_batch, "test", 1)
    path.write_text(plan.to_json())


def write_data(path: Path, plan: Path, count: int = 7, seed: int = 0) -> None:
    """Examples of random lengths (padded by the reader), some labels ignored, masks left to the reader."""
    from partitioning.files import read_plan

    _, _, cfg, specs, micro_batch = plan_model(read_plan(plan))
    rng = random.Random(seed)
    with path.open("w") as out:
        for _ in range(count):
            lengths = {name: rng.randint(2, size) for name, size in micro_batch.lengths.items()}
            example: dict[str, Any] = {}
            for spec in specs:
                if spec.fill != "randint":
                    continue
                low = spec.low if isinstance(spec.low, int) else getattr(cfg, spec.low)
                high = spec.high if isinstance(spec.high, int) else getattr(cfg, str(spec.high))
                dims = [d for d in spec.shape if d != "batch"]
                values = [rng.randrange(low, high) for _ in range(lengths[str(dims[0])] if dims else 1)]
                if spec.name.endswith("labels"):
                    values = [-100 if rng.random() < 0.2 else v for v in values]
                example[spec.name] = values if dims else values[0]
            out.write(json.dumps(example) + "\n")


def launch(ranks: int, cases: dict[str, list[str]], out: Path) -> dict[str, list[dict]]:
    """Run each case (a train-model command line) on ``ranks`` torchrun ranks; each rank's record per case."""
    out.mkdir(exist_ok=True)
    (out / "cases.json").write_text(json.dumps(cases))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([TORCHRUN, "--standalone", f"--nproc-per-node={ranks}", str(SUPPORT / "train_worker.py"),
                             str(out), str(out / "cases.json")], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    records: dict[str, list[dict]] = {}
    for path in sorted(out.glob("*.rank*.json")):
        record = json.loads(path.read_text())
        records.setdefault(record["case"], []).append(record)
    assert sorted(records) == sorted(cases)
    return records


def reference(family: str, checkpoint: Path, plan: Path, data: Path, steps: int,
              micro_batches: int = MICRO_BATCHES, bf16: bool = False) -> torch.nn.Module:
    """``steps`` steps in one process: stock model, AdamW, transformers' cosine warm-up, clip_grad_norm_.

    A step is ``micro_batches`` micro-batches (all replicas' of a data-parallel run), their gradients averaged.
    ``bf16``: each forward under CPU bf16 autocast, the backward outside it (fp32 weights and AdamW).
    """
    from partitioning.files import read_plan

    _, _, cfg, specs, micro_batch = plan_model(read_plan(plan))
    size = PER_MICRO_BATCH * micro_batches
    dataset = read_dataset(data, specs, cfg, micro_batch, size)
    with threads():
        model = stock_class(family).from_pretrained(checkpoint).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
        scheduler = transformers.get_cosine_schedule_with_warmup(optimizer, 2, steps)
        for step in range(steps):
            batch = dataset.batch(step, size, 0)
            for chunk in range(micro_batches):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = model(**{k: v.tensor_split(micro_batches)[chunk] for k, v in batch.items()}).loss
                loss.backward()
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.div_(micro_batches)  # the schedule scales the summed gradients so
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return model


def assert_saved_equals(family: str, saved: Path, expected: torch.nn.Module) -> None:
    different = saved_differences(family, saved, expected)
    assert different == {}, sorted(different.items(), key=lambda item: -item[1])[:5]


def saved_differences(family: str, saved: Path, expected: torch.nn.Module) -> dict[str, float]:
    """Stock key -> the largest absolute difference, for every tensor of ``saved`` not torch.equal to ``expected``."""
    model, info = stock_class(family).from_pretrained(saved, output_loading_info=True)
    assert info["missing_keys"] == [] and info["unexpected_keys"] == [], info
    got, want = model.state_dict(), expected.state_dict()
    assert sorted(got) == sorted(want)
    return {key: float((got[key].double() - want[key].double()).abs().max()) for key in want
            if not torch.equal(got[key], want[key])}


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


def assert_stage_only(records: list[dict]) -> None:
    for record in records:
        assert record["others_meta"], record["rank"]  # no other stage's parameter was ever given memory
        assert record["loaded"] == record["own"], record["rank"]  # exactly this stage's tensors were read


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
        common = ["--plan", str(plan), "--data", str(data), *OPTIONS]
        cases["half"] = [*common, "--checkpoint", str(checkpoint), "--steps", "2", "--decay-steps", "4", "--save",
                         str(tmp_path / "half")]
        cases["resumed"] = [*common, "--resume", str(tmp_path / "half"), "--steps", "4", "--save",
                            str(tmp_path / "resumed")]
        cases["whole"] = [*common, "--checkpoint", str(checkpoint), "--steps", "4", "--save", str(tmp_path / "whole")]
    records = launch(2, cases, tmp_path / "records")
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
        plan, data = expected["gpipe"]
        assert_saved_equals(family, tmp_path / "whole", reference(family, checkpoint, plan, data, 4))


def test_three_stages(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    cfg = save_checkpoint("t5", checkpoint)
    plan, data = tmp_path / "plan.json", tmp_path / "data.jsonl"
    write_plan("t5", cfg, "encoder.block.1,lm_head", "gpipe", plan)
    write_data(data, plan)
    records = launch(3, {"three": ["--plan", str(plan), "--checkpoint", str(checkpoint), "--data", str(data),
                                   "--steps", str(STEPS), "--save", str(tmp_path / "out"), *OPTIONS]},
                     tmp_path / "records")
    assert_stage_only(records["three"])
    assert_saved_equals("t5", tmp_path / "out", reference("t5", checkpoint, plan, data, STEPS))
