"""train-model --dtype fp16: fp16 autocast forwards and a loss scale over the pipeline's ranks, as HF Trainer's fp16.

T5 (its fp16 clamps included) and the tied GPT-2 train 3 steps on 2 CPU gloo ranks under fp16 autocast; the saves
must be torch.equal to one process running torch's own GradScaler the way Trainer (accelerate) runs it: the loss
scaled, the gradients unscaled before clipping, a step whose gradients overflow skipped with the schedule's step,
the scale halved.  With an initial scale of 2**100 every step overflows: the weights stay the checkpoint's, the
scale halves each step, each step line says so, and the metrics record it; the one-process run skips alike.
A run of 2 steps, saved and resumed to 4, continues the saved scale: equal to 4 steps in one go.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import train_runs
from support.model_families import FAMILIES
from support.train_runs import OPTIONS, STEPS, launch, write_data

from partitioning.train.cli import main
from partitioning.train.layout import METRICS
from partitioning.train.loss_scale import INITIAL

CASES = {"t5": ("2layer-gelu-tied", "encoder.block.1", "gpipe"),
         "gpt2": ("3layer-tied-relu-inner", "transformer.h.2", "1f1b")}
HUGE = 2.0**100  # every step's fp16 gradients overflow from this scale on (an fp32 number: the scale is one)


Made = dict[str, tuple[Path, Path, Path]]  # family -> its checkpoint, plan, data


def assert_equal(family_name: str, saved: Path, expected: object) -> None:
    different = train_runs.saved_differences(FAMILIES[family_name], saved, expected)  # type: ignore[arg-type]
    assert different == {}, sorted(different.items(), key=lambda item: -item[1])[:5]


def trained_as_one_process(runs: tuple[Path, Made], family_name: str, saved: str, steps: int,
                           scale: float) -> tuple[list[bool], list[dict]]:
    """The saved run ``saved`` equals ``steps`` of one process from the loss scale ``scale``: which steps that
    process skipped, and the run's metrics records."""
    root, made = runs
    checkpoint, plan, data = made[family_name]
    skipped: list[bool] = []
    expected = train_runs.reference(FAMILIES[family_name], checkpoint, plan, data, steps, fp16_scale=scale,
                                    skipped=skipped)
    assert_equal(family_name, root / saved, expected)
    return skipped, [json.loads(line) for line in (root / saved / METRICS).read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Made]:
    """Every family's checkpoint, plan and data, and every case trained in one 2-rank launch."""
    root = tmp_path_factory.mktemp("fp16")
    cases, made = {}, {}
    for name, (config, split, schedule) in CASES.items():
        family = FAMILIES[name]
        checkpoint, plan, data = root / f"{name}.in", root / f"{name}.plan.json", root / f"{name}.jsonl"
        cfg = train_runs.save_checkpoint(family, config, checkpoint)
        train_runs.write_plan(family, cfg, split, schedule, plan)
        write_data(data, plan)
        made[name] = (checkpoint, plan, data)
        common = ["--plan", str(plan), "--data", str(data), "--dtype", "fp16", *OPTIONS]
        cases[name] = [*common, "--checkpoint", str(checkpoint), "--steps", str(STEPS), "--save", str(root / name)]
        cases[f"{name}-huge"] = [*common, "--checkpoint", str(checkpoint), "--steps", "2", "--loss-scale", str(HUGE),
                                 "--save", str(root / f"{name}-huge")]
    checkpoint, plan, data = made["t5"]
    common = ["--plan", str(plan), "--data", str(data), "--dtype", "fp16", *OPTIONS]
    cases["half"] = [*common, "--checkpoint", str(checkpoint), "--steps", "2", "--decay-steps", "4", "--loss-scale",
                     str(HUGE), "--save", str(root / "half")]
    cases["resumed"] = [*common, "--resume", str(root / "half"), "--steps", "4", "--save", str(root / "resumed")]
    launch(2, cases, root / "records")
    return root, made


@pytest.mark.parametrize("family_name", CASES)
def test_fp16_equals_one_process_with_torchs_grad_scaler(runs: tuple[Path, Made], family_name: str) -> None:
    skipped, logged = trained_as_one_process(runs, family_name, family_name, STEPS, INITIAL)
    assert [record["skipped"] for record in logged] == skipped
    assert logged[0]["loss_scale"] == INITIAL and all("grad_norm" in r for r in logged if not r["skipped"])


@pytest.mark.parametrize("family_name", CASES)
def test_an_overflow_skips_the_step_on_every_rank_and_halves_the_scale(runs: tuple[Path, Made],
                                                                      family_name: str) -> None:
    skipped, logged = trained_as_one_process(runs, family_name, f"{family_name}-huge", 2, HUGE)
    assert skipped == [True, True]
    checkpoint = runs[1][family_name][0]  # the checkpoint's weights, untrained
    assert_equal(family_name, runs[0] / f"{family_name}-huge", train_runs.load_stock(FAMILIES[family_name], checkpoint))
    assert [(r["loss_scale"], r["skipped"], r["lr"]) for r in logged] == [(HUGE, True, 0.0), (HUGE / 2, True, 0.0)]
    assert all("grad_norm" not in record for record in logged)  # inf or NaN: no JSON number


def test_a_resumed_fp16_run_continues_its_scale(runs: tuple[Path, Made]) -> None:
    """2 steps from 2**100 (both skipped), saved, resumed to 4 without --loss-scale: the saved 2**98 goes on (a
    fresh 2**16 would train)."""
    skipped, logged = trained_as_one_process(runs, "t5", "resumed", 4, HUGE)
    assert [(r["step"], r["loss_scale"], r["skipped"]) for r in logged] == [
        (step + 1, HUGE / 2**step, skipped[step]) for step in range(4)]


def test_a_loss_scale_without_fp16_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text("{}")
    code = main(["--plan", str(tmp_path / "plan.json"), "--checkpoint", str(tmp_path), "--data",
                 str(tmp_path / "plan.json"), "--steps", "1", "--loss-scale", "1024"])
    err = capsys.readouterr().err
    assert code == 2 and err == "train-model: error: --loss-scale S scales the loss of --dtype fp16: give it\n", err
