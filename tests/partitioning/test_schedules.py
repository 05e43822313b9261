"""Planning for a schedule: the engine's names, virtual stages, looped and V splits, ``--schedule auto``."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.t5_models import config

from common.errors import UserError
from partitioning.cli import main
from partitioning.plan import Block, Plan
from partitioning.schedules import SCHEDULES, placement, schedule_name
from partitioning.settings import Settings
from partitioning.solve.chunks import predict, search
from partitioning.solve.costs import ChainCosts
from partitioning.solve.partition import min_max_split, partition
from partitioning.solve.report import format_plan


def chain(flops: list[float], activation: int = 0) -> list[Block]:
    return [Block(f"b{i}", (f"m{i}",), f, 10, 0, activation) for i, f in enumerate(flops)]


def settings(schedule: str, micro: int = 4, virtual: int | None = None, **more: object) -> Settings:
    return Settings(device_flops=1.0, bandwidth=1e30, micro_batches=micro, schedule=schedule,
                    virtual_stages=virtual, **more)  # type: ignore[arg-type]


def test_names_come_from_the_engine_in_any_case() -> None:
    assert set(SCHEDULES) == {"gpipe", "1f1b", "interleaved1f1b", "loopedbfs", "interleavedzerobubble",
                              "zbvzerobubble", "dualpipev"}
    assert schedule_name("ZBVZeroBubble") == "zbvzerobubble" and schedule_name("AUTO") == "auto"
    with pytest.raises(UserError, match="unknown schedule 'interleaved'; known: 1f1b, gpipe"):
        schedule_name("interleaved")


@pytest.mark.parametrize(("schedule", "virtual", "message"), [
    ("interleaved1f1b", 1, "must be >= 2, got 1"), ("loopedbfs", 1, "must be >= 2"),
    ("zbvzerobubble", 3, "must be 2, got 3"), ("dualpipev", 4, "must be 2"), ("1f1b", 2, "must be 1, got 2")])
def test_bad_virtual_stages(schedule: str, virtual: int, message: str) -> None:
    with pytest.raises(UserError, match=message):
        settings(schedule, virtual=virtual)


def test_defaults_and_placements() -> None:
    assert settings("1f1b").virtual_stages == 1 and settings("interleaved1f1b").virtual_stages == 2
    assert placement("interleaved1f1b", 3, 2) == (0, 1, 2, 0, 1, 2)  # chunk j on rank j mod K
    assert placement("dualpipev", 3, 2) == (0, 1, 2, 2, 1, 0)  # rank r: chunks r and 2K-1-r


def test_the_engine_refuses_counts_in_one_line() -> None:
    with pytest.raises(UserError, match="dualpipev schedule cannot run 3 micro-batches on 2 ranks x 2 chunks: "
                                        "DualPipeV requires at least as many microbatches as stages"):
        partition(chain([1.0] * 6), 2, settings("dualpipev", micro=3))


def test_looped_plan_beats_the_contiguous_bottleneck() -> None:
    # Chunks [1] [3] [1] [2 1] have the least largest chunk (3), but the loop puts 1 + 1 on rank 0 and 3 + 3 on
    # rank 1; the search moves a cut to [1] [3] [1 2] [1]: the same largest chunk, ranks 4 and 4.
    blocks = chain([1.0, 3.0, 1.0, 2.0, 1.0])
    costs = ChainCosts(blocks, settings("interleaved1f1b", virtual=2))
    start = min_max_split(5, 4, lambda s, i, j: costs.cost(i, j))
    assert start == [(0, 0), (1, 1), (2, 2), (3, 4)]
    contiguous, searched = predict(costs, start, 2), search(costs, 2, start)
    assert searched.segments == ((0, 0), (1, 1), (2, 3), (4, 4))
    assert searched.step_time < contiguous.step_time
    plan = partition(blocks, 2, settings("interleaved1f1b", virtual=2))
    assert [s.blocks for s in plan.stages] == [("b0",), ("b1",), ("b2", "b3"), ("b4",)]
    assert plan.placement == [0, 1, 0, 1] and plan.settings["stages"] == 2
    assert plan.prediction["step_time"] == searched.step_time
    again = Plan.from_json(plan.to_json())
    again.validate()
    assert again.placement == plan.placement and again.prediction == plan.prediction
    assert "predicted step" in format_plan(plan) and "chunk, rank" in format_plan(plan)


def test_auto_picks_several_chunks_per_rank_when_micro_batches_are_few() -> None:
    blocks = chain([1.0] * 16)
    few = partition(blocks, 4, settings("auto", micro=4))
    assert few.settings["virtual_stages"] > 1 and few.settings["schedule"] not in ("gpipe", "1f1b")
    one_f_one_b = next(row for row in few.prediction["alternatives"] if row["schedule"] == "1f1b")
    assert few.prediction["step_time"] < one_f_one_b["step_time"]
    # weight gradients not split off (W costs nothing): the interleaved schedule with the most chunks wins
    interleaved = partition(blocks, 4, settings("auto", micro=4, weight_gradient=0.0))
    assert interleaved.settings["schedule"] in ("interleaved1f1b", "loopedbfs", "interleavedzerobubble")
    assert interleaved.settings["virtual_stages"] == 4
    assert "instead 1f1b" in format_plan(few)


def test_auto_respects_the_memory_limit() -> None:
    blocks = chain([1.0] * 8, activation=100)  # 40 B of parameter state and 100 B of activations per block
    free = partition(blocks, 4, settings("auto", micro=8))
    assert max(free.prediction["rank_memory_bytes"]) == 880 and free.settings["virtual_stages"] == 2
    limited = partition(blocks, 4, settings("auto", micro=8, memory_limit=700.0))
    assert max(limited.prediction["rank_memory_bytes"]) <= 700 < 880
    assert limited.prediction["step_time"] > free.prediction["step_time"]
    with pytest.raises(UserError, match="no schedule has a plan on 4 ranks that fits"):
        partition(blocks, 4, settings("auto", micro=8, memory_limit=300.0))


def test_one_stage_plans_keep_their_numbers_and_gain_a_prediction() -> None:
    blocks = chain([1.0, 2.0, 3.0, 1.0, 1.0])
    plan = partition(blocks, 2, settings("1f1b", micro=6))
    assert [s.blocks for s in plan.stages] == [("b0", "b1"), ("b2", "b3", "b4")]
    assert plan.bottleneck == 15.0 and plan.placement == []
    # stage 1 busy 6 x 15, after stage 0's first forward (3), before stage 0's last backward (6)
    assert plan.prediction["step_time"] == 3.0 + 6 * 15.0 + 6.0


def test_cli_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = tmp_path / "config.json"
    tiny.write_text(config("2layer-gelu-tied").to_json_string())
    base = ["t5", "--version", "4.5.1", "--batch", "2", "--source-len", "7", "--target-len", "5",
            "--config", str(tiny), "--stages", "2", "--output", str(tmp_path / "plan.json")]
    assert main(base + ["--schedule", "ZBVZeroBubble", "--virtual-stages", "3"]) == 2
    err = capsys.readouterr().err
    assert err == "partition-model: error: the zbvzerobubble schedule runs a V of two chunks per rank: virtual " \
                  "stages must be 2, got 3\n"
    assert main(base + ["--schedule", "Interleaved1F1B", "--micro-batches", "4"]) == 0
    plan = Plan.from_json((tmp_path / "plan.json").read_text())
    assert plan.settings["schedule"] == "interleaved1f1b" and plan.settings["virtual_stages"] == 2
    assert len(plan.stages) == 4 and plan.placement == [0, 1, 0, 1]
    assert "predicted step" in capsys.readouterr().out
