"""Calibration: measured once on the machine (block times, rates, link bandwidth), used to plan many shapes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from support.t5_models import T5, config

from common.errors import UserError
from families.models import MicroBatch
from partitioning.cli import main
from partitioning.cost.calibration import Calibration, role
from partitioning.cost.chain import family_chain
from partitioning.plan import Plan
from partitioning.solve.partition import Settings

CLASS = "T5ForConditionalGeneration"
LAYERS = ("encoder.block", "decoder.block")


def _calibration(micro_batch: MicroBatch) -> tuple[Calibration, dict]:
    cfg = config("2layer-gelu-tied")
    chain = family_chain(T5, CLASS, cfg, micro_batch, sublayers=True)
    described = T5.describe(CLASS, cfg, micro_batch, "tiny", "sublayer")
    # 1 ns per FLOP in layers, 1 us for blocks without FLOPs
    blocks = [{"name": b.name, "flops": b.flops, "seconds": b.flops * 1e-9 or 1e-6,
               "activation_bytes": b.activation_bytes} for b in chain.blocks]
    return Calibration(device="cpu", threads=1, backend="gloo", bandwidth=2e9, memory_bandwidth=5e9, flops=1e9,
                       backward_factor=1.5, model=described, blocks=blocks), described


def test_roles_drop_the_layer_index_only() -> None:
    assert role("encoder.block.3.layer.1", LAYERS) == "encoder.block.#.layer.1"
    assert role("decoder.block.11", LAYERS) == "decoder.block.#"
    assert role("lm_head", LAYERS) == "lm_head"


def test_the_same_model_keeps_its_times_and_another_shape_scales_by_role() -> None:
    small = MicroBatch(2, {"source": 7, "target": 5})
    calibration, described = _calibration(small)
    chain = family_chain(T5, CLASS, config("2layer-gelu-tied"), small, sublayers=True)
    same = calibration.apply(chain, LAYERS, described)
    assert [b.seconds for b in same.blocks] == [b["seconds"] for b in calibration.blocks]
    large = MicroBatch(4, {"source": 9, "target": 5})
    bigger = family_chain(T5, CLASS, config("2layer-gelu-tied"), large, sublayers=True)
    scaled = calibration.apply(bigger, LAYERS, {**described, "micro_batch": large.to_dict()})
    by_name = {b.name: b for b in scaled.blocks}
    for block in bigger.blocks:
        if block.flops:  # the role's rate: 1 ns per FLOP
            assert by_name[block.name].seconds == pytest.approx(block.flops * 1e-9)
    # a layer block takes its sub-layers' rate
    layers = family_chain(T5, CLASS, config("2layer-gelu-tied"), large)
    merged = calibration.apply(layers, LAYERS, {**described, "micro_batch": large.to_dict()})
    assert merged.blocks[1].seconds == pytest.approx(layers.blocks[1].flops * 1e-9)
    settings = calibration.settings(Settings(micro_batches=3))
    assert (settings.measured, settings.bandwidth, settings.device_flops, settings.backward_factor,
            settings.memory_bandwidth, settings.micro_batches) == (True, 2e9, 1e9, 1.5, 5e9, 3)


def test_calibration_files_round_trip_and_bad_ones_are_one_line_errors(tmp_path: Path) -> None:
    calibration, _ = _calibration(MicroBatch(2, {"source": 7, "target": 5}))
    assert Calibration.from_json(calibration.to_json()).to_json() == calibration.to_json()
    with pytest.raises(UserError, match="x.json is not a calibration file"):
        Calibration.from_json("{}", "x.json")
    with pytest.raises(UserError, match="non-positive"):
        Calibration.from_json(replace(calibration, bandwidth=0.0).to_json())
    data = json.loads(calibration.to_json())
    data["blocks"][0]["seconds"] = -1
    with pytest.raises(UserError, match="bad block"):
        Calibration.from_json(json.dumps(data))


def test_calibrate_on_this_machine_then_plan_from_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real step: block times, rates and a two-rank gloo ping-pong under torchrun, then a plan."""
    cfg = tmp_path / "config.json"
    cfg.write_text(config("2layer-gelu-tied").to_json_string())
    base = ["t5", "--version", "4.5.1", "--config", str(cfg), "--batch", "2", "--source-len", "7", "--target-len", "5"]
    saved = tmp_path / "calibration.json"
    assert main(base + ["--calibrate", str(saved), "--device", "cpu", "--measure", "2"]) == 0
    out = capsys.readouterr().out
    assert "gloo link" in out and f"wrote {saved}" in out
    calibration = Calibration.from_json(saved.read_text())
    assert calibration.backend == "gloo" and calibration.threads == 1 and calibration.bandwidth > 0
    assert all(b["seconds"] > 0 for b in calibration.blocks if b["flops"])
    # the runtime's own terms, measured (a message's latency, an action's overhead: well under a second)
    assert 0 < calibration.latency < 1 and 0 < calibration.action_overhead < 1 and calibration.update_rate > 0
    assert "us per action" in out
    plan_file = tmp_path / "plan.json"
    assert main(base + ["--stages", "2", "--calibration", str(saved), "--output", str(plan_file)]) == 0
    assert "calibrated on cpu" in capsys.readouterr().out
    plan = Plan.from_json(plan_file.read_text())
    assert plan.settings["measured"] and plan.settings["bandwidth"] == calibration.bandwidth
    assert plan.settings["action_overhead"] == calibration.action_overhead and "rank_tied_sync" in plan.prediction
    seconds = {b["name"]: b["seconds"] for b in calibration.blocks}
    for block in plan.blocks:  # the calibrated shape: every block keeps its measured time (summed per layer)
        assert block.seconds == pytest.approx(sum(s for n, s in seconds.items()
                                                  if n == block.name or n.startswith(block.name + ".")))


@pytest.mark.parametrize("extra,message", [
    (["--stages", "2", "--calibration", "{missing}"], "cannot read calibration"),
    (["--stages", "2", "--calibration", "{bad}"], "is not a calibration file"),
    (["--stages", "2", "--calibration", "{bad}", "--measure", "2", "--device", "cpu"], "not both"),
    (["--calibrate", "{out}"], "--calibrate needs a real --device"),
    (["--calibrate", "{out}", "--device", "cpu", "--class", "T5Model"], "it needs a class that computes its loss"),
])
def test_bad_calibration_arguments_exit_2(extra: list[str], message: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.json").write_text("[]")
    paths = {"missing": tmp_path / "none.json", "bad": tmp_path / "bad.json", "out": tmp_path / "out.json"}
    argv = ["t5", "--version", "4.5.1", "--output", str(tmp_path / "plan.json")] + [a.format(**paths) for a in extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out.json").exists()
