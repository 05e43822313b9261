"""``partition-model --run --timeline FILE``: every action of a 2-rank 1F1B step, on every rank, in the schedule's order.

One torchrun launch (tiny tied T5, 2 gloo ranks, 3 micro-batches, 2 steps).  The timeline must hold, per
rank and step: one forward and one backward per micro-batch of the rank's chunk, in the order the simulator
runs them (:func:`partitioning.schedules.orders`: the timeline is the schedule that runs); a wait for
every received activation (rank 1) and gradient (rank 0); the tied-gradient sum; the optimizer step; and
every span inside its step.  The breakdown then counts each second of a step once.  A second launch
(one step) records the ``--tied-sum allreduce`` sum as the same span.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.model_families import FAMILIES

from partitioning.cli import main
from partitioning.gpu.launch import launch
from partitioning.gpu.timeline import COMPUTE, breakdown
from partitioning.schedules import orders

MICRO_BATCHES, STEPS = 3, 2


def test_timeline_records_every_action_of_a_1f1b_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t5 = FAMILIES["t5"]
    cfg = tmp_path / "config.json"
    cfg.write_text(t5.make_config(t5.configs[0]).to_json_string())
    timeline = tmp_path / "out" / "timeline.json"
    lengths = [f"--{name}-len={length}" for name, length in t5.train_lengths.items()]
    code = main(["t5", "--version", "4.5.1", "--stages", "2", "--config", str(cfg), "--batch", "2", *lengths,
                 "--micro-batches", str(MICRO_BATCHES), "--schedule", "1f1b", "--output", str(tmp_path / "plan.json"),
                 "--run", "--run-steps", str(STEPS), "--timeline", str(timeline)])
    out = capsys.readouterr().out
    assert code == 0, out
    record = json.loads(timeline.read_text())
    assert (record["schedule"], record["micro_batches"], record["ranks"]) == ("1f1b", MICRO_BATCHES, 2)
    events = record["events"]
    expected = orders("1f1b", 2, 1, MICRO_BATCHES)
    for step in range(STEPS):
        for rank in (0, 1):
            mine = sorted((e for e in events if e["rank"] == rank and e["step"] == step), key=lambda e: e["start"])
            frame = [e for e in mine if e["kind"] == "step"]
            assert len(frame) == 1
            assert all(frame[0]["start"] <= e["start"] <= e["end"] <= frame[0]["end"] for e in mine)
            compute = [(e["chunk"], e["kind"], e["micro_batch"]) for e in mine if e["kind"] in COMPUTE]
            assert compute == [tuple(action) for action in expected[rank]], (rank, compute)
            kinds = [e["kind"] for e in mine]
            assert kinds.count("optimizer") == 1 and kinds.count("tied_sync") == 1, kinds
            assert kinds.count("split_inputs") == 1 and kinds.count("reduce_grad") == 1, kinds
            # every message is posted and waited for: rank 1 receives m activations and sends m gradients, rank 0
            # the reverse (1F1B posts a send and the next receive together in its steady state)
            posted = [k.removeprefix("post_") for k in kinds if k.startswith("post_")]
            waited = [k.removeprefix("wait_") for k in kinds if k.startswith("wait_")]
            assert sorted(posted) == sorted(waited), kinds
            assert sum(k.count("send") for k in posted) >= MICRO_BATCHES, kinds  # sends may go in a batch
            assert sum(k.count("recv") for k in posted) >= MICRO_BATCHES, kinds
            compute_spans = [e for e in mine if e["kind"] in COMPUTE]
            assert all(a["end"] <= b["start"] for a, b in zip(compute_spans, compute_spans[1:]))
        parts = breakdown(events, step)
        for rank in (0, 1):
            assert parts[rank]["idle"] >= -1e-9
            assert sum(v for k, v in parts[rank].items() if k != "step") == pytest.approx(parts[rank]["step"])
    # the other sum (--tied-sum allreduce) is recorded as one tied_sync span per rank and step too
    launch(tmp_path / "plan.json", 2, 1, timeline, tied_sum="allreduce")
    kinds = [(e["rank"], e["kind"]) for e in json.loads(timeline.read_text())["events"] if e["kind"] == "tied_sync"]
    assert sorted(kinds) == [(0, "tied_sync"), (1, "tied_sync")], kinds


def test_timeline_needs_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["t5", "--version", "4.5.1", "--stages", "2", "--output", str(tmp_path / "plan.json"),
                 "--timeline", str(tmp_path / "t.json")])
    assert code == 2
    assert capsys.readouterr().err.strip() == "partition-model: error: --timeline records a pipelined run: give --run too"
    assert not (tmp_path / "plan.json").exists()
