"""The partitioner is exactly optimal (against brute force), respects memory, and fails with clear errors."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from common.errors import UserError
from partitioning.plan import Block, Plan
from partitioning.solve.partition import Settings, build_plan, min_max_split, partition


def chain(flops: list[int], out: list[int] | None = None, params: list[int] | None = None,
          acts: list[int] | None = None) -> list[Block]:
    n = len(flops)
    out, params, acts = out or [0] * n, params or [0] * n, acts or [0] * n
    return [Block(f"b{i}", (f"m{i}",), float(flops[i]), params[i], out[i], acts[i]) for i in range(n)]


def brute_force(blocks: list[Block], k: int, s: Settings
                ) -> tuple[tuple[float, ...], int, tuple[int, ...]] | None:
    """Every split, costed from the definitions: (stage costs from the largest down, bytes over the cuts, stage
    ends), the least."""
    n, best = len(blocks), None
    for cuts in itertools.combinations(range(n - 1), k - 1):
        ends = (*cuts, n - 1)
        starts = (0, *(c + 1 for c in cuts))
        costs, fits = [], True
        for stage, (i, j) in enumerate(zip(starts, ends)):
            part = blocks[i:j + 1]
            send = blocks[j].out_bytes / s.bandwidth if j < n - 1 else 0.0
            costs.append(3.0 * math.fsum(b.flops for b in part) / s.device_flops + send)
            in_flight = s.micro_batches if s.schedule == "gpipe" else min(s.micro_batches, k - stage)
            memory = ((2 + s.optimizer_states + s.master_weights) * sum(b.param_bytes for b in part)
                      + in_flight * sum(b.activation_bytes for b in part))
            fits = fits and (s.memory_limit is None or memory <= s.memory_limit)
        if fits:
            key = (tuple(sorted(costs, reverse=True)), sum(blocks[c].out_bytes for c in cuts), ends)
            best = key if best is None or key < best else best
    return best


small = st.integers(min_value=0, max_value=40)


@st.composite
def problems(draw: st.DrawFn) -> tuple[list[Block], int, Settings]:
    n = draw(st.integers(min_value=1, max_value=8))
    # Few distinct values make ties (equal bottlenecks, equal cut bytes) common.
    blocks = chain([draw(small) for _ in range(n)], [draw(small) for _ in range(n)],
                   [draw(small) for _ in range(n)], [draw(small) for _ in range(n)])
    k = draw(st.integers(min_value=1, max_value=n))
    s = Settings(device_flops=draw(st.sampled_from([1.0, 3.0, 7.0])), bandwidth=draw(st.sampled_from([1.0, 2.0, 1e9])),
                 micro_batches=draw(st.integers(min_value=1, max_value=4)),
                 schedule=draw(st.sampled_from(["gpipe", "1f1b"])),
                 optimizer_states=draw(st.integers(min_value=0, max_value=2)), master_weights=draw(st.booleans()))
    if draw(st.booleans()):  # a limit somewhere between nothing fitting and everything fitting on one device
        whole = (s.state_copies * sum(b.param_bytes for b in blocks)
                 + s.micro_batches * sum(b.activation_bytes for b in blocks))
        s = replace(s, memory_limit=float(max(1, round(whole * draw(st.floats(min_value=0.05, max_value=1.0))))))
    return blocks, k, s


@hypothesis_settings(max_examples=300, deadline=None)
@given(problems())
def test_partition_equals_brute_force_including_ties(problem: tuple[list[Block], int, Settings]) -> None:
    blocks, k, s = problem
    expected = brute_force(blocks, k, s)
    if expected is None:
        with pytest.raises(UserError, match="no split into"):
            partition(blocks, k, s)
        return
    plan = partition(blocks, k, s)
    ends = tuple(blocks.index(next(b for b in blocks if b.name == stage.blocks[-1])) for stage in plan.stages)
    cut_bytes = sum(blocks[j].out_bytes for j in ends[:-1])
    assert (tuple(sorted((stage.cost for stage in plan.stages), reverse=True)), cut_bytes, ends) == expected
    assert plan.loads == expected[0] and plan.bottleneck == expected[0][0]
    if s.memory_limit is not None:
        assert all(stage.memory_bytes <= s.memory_limit for stage in plan.stages)


def test_memory_limit_moves_the_split_and_1f1b_holds_fewer_micro_batches_late() -> None:
    blocks = chain([10, 10, 10, 10], acts=[40, 40, 40, 1])
    free = partition(blocks, 2, Settings(device_flops=1.0, micro_batches=4))
    assert [stage.blocks for stage in free.stages] == [("b0", "b1"), ("b2", "b3")]
    assert [stage.memory_bytes for stage in free.stages] == [2 * 80, 1 * 41]  # 1F1B: stage s holds K - s
    limited = partition(blocks, 2, Settings(device_flops=1.0, micro_batches=4, memory_limit=100.0))
    assert [stage.blocks for stage in limited.stages] == [("b0",), ("b1", "b2", "b3")]
    assert [stage.memory_bytes for stage in limited.stages] == [80, 81]
    assert limited.bottleneck == 90.0 > free.bottleneck == 60.0


def test_no_split_fits_names_the_stage_and_the_overflow() -> None:
    blocks = chain([10, 10, 10, 10], acts=[40, 40, 40, 1])
    gpipe = Settings(device_flops=1.0, micro_batches=4, schedule="gpipe", memory_limit=100.0)
    # GPipe holds all 4 micro-batches; the least-overflowing split is b0..b1 | b2..b3 at 320 B
    with pytest.raises(UserError, match=r"^no split into 2 stages fits 100 B per device: at best, stage 0 "
                                        r"\(blocks b0..b1\) needs 320 B, 220 B over$"):
        partition(blocks, 2, gpipe)


def test_optimizer_states_and_master_weights_count_against_memory() -> None:
    blocks = chain([10, 10, 10, 10], params=[100, 0, 0, 0])
    adam = partition(blocks, 2, Settings(device_flops=1.0, memory_limit=450.0))
    assert adam.stages[0].memory_bytes == 400  # weights, gradients, exp_avg, exp_avg_sq
    with pytest.raises(UserError, match=r"stage 0 \(block 'b0' alone\) needs 500 B, 50 B over$"):
        partition(blocks, 2, Settings(device_flops=1.0, memory_limit=450.0, master_weights=True))
    sgd = partition(blocks, 2, Settings(device_flops=1.0, optimizer_states=0))
    assert sgd.stages[0].memory_bytes == 200


def test_stage_costs_are_compute_times_three_plus_the_outgoing_send() -> None:
    blocks = chain([2_000, 1_000, 3_000], out=[500, 2_000, 10_000])  # cutting after b1 would send 20 s
    plan = partition(blocks, 2, Settings(device_flops=1_000.0, bandwidth=100.0))
    first, last = plan.stages
    assert (first.blocks, last.blocks) == (("b0",), ("b1", "b2"))
    assert (first.compute, first.communication) == (6.0, 5.0)
    assert (last.compute, last.communication) == (12.0, 0.0)  # the last stage sends nothing
    assert plan.bottleneck == 12.0 and plan.ideal == 9.0 and plan.ratio == 12.0 / 9.0


def test_measured_seconds_replace_flops_when_asked() -> None:
    blocks = [Block("a", ("a",), 1.0, 0, 0, seconds=0.5), Block("b", ("b",), 100.0, 0, 0, seconds=0.25)]
    plan = partition(blocks, 2, Settings(measured=True))
    assert [stage.compute for stage in plan.stages] == [1.5, 0.75]
    with pytest.raises(UserError, match="'c' has no measured time"):
        partition(blocks + [Block("c", ("c",), 1.0, 0, 0)], 2, Settings(measured=True))


@pytest.mark.parametrize("stages,message", [(0, "at least 1, got 0"), (-2, "at least 1, got -2"),
                                            (4, "cannot split 3 blocks into 4 stages")])
def test_bad_stage_counts(stages: int, message: str) -> None:
    with pytest.raises(UserError, match=message):
        partition(chain([1, 1, 1]), stages, Settings())


@pytest.mark.parametrize("kwargs,message", [({"device_flops": 0.0}, "positive"), ({"bandwidth": -1.0}, "positive"),
                                            ({"micro_batches": 0}, "micro-batches"), ({"schedule": "zb"}, "schedule"),
                                            ({"memory_limit": 0.0}, "memory limit"),
                                            ({"optimizer_states": -1}, "optimizer")])
def test_bad_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        Settings(**kwargs)


def test_min_max_split_ties_prefer_light_cuts_then_early_ends() -> None:
    unit = lambda s, i, j: float(j - i + 1)  # noqa: E731
    assert min_max_split(4, 2, unit) == [(0, 1), (2, 3)]
    assert min_max_split(5, 2, unit) == [(0, 1), (2, 4)]  # 2|3 and 3|2 tie: the earlier end
    assert min_max_split(5, 2, unit, cut_weight=lambda j: 0 if j == 2 else 1) == [(0, 2), (3, 4)]
    assert min_max_split(3, 2, unit, allowed=lambda s, i, j: i != j) is None


def test_plan_json_round_trip_and_validation() -> None:
    blocks = [Block("a", ("x",), 1.0, 4, 8, 16, 0.5, ("w",), ("t: float32[2]",)), Block("b", ("y",), 2.0, 0, 0)]
    plan = build_plan(blocks, [(0, 0), (1, 1)], Settings(), {"family": "toy"})
    again = Plan.from_json(plan.to_json())
    assert again.blocks == plan.blocks and again.stages == plan.stages and again.settings == plan.settings
    again.validate()
    broken = Plan.from_json(plan.to_json().replace('"b"\n', '"nope"\n'))
    with pytest.raises(UserError, match="unknown block name 'nope'|stage 1 names unknown block 'nope'"):
        broken.validate()
    with pytest.raises(UserError, match="unknown block name 'zz'"):
        plan.stage_of("zz")
    with pytest.raises(UserError, match="not a plan file"):
        Plan.from_json("{}")


def test_every_later_stage_using_a_shared_weight_holds_a_replica() -> None:
    # The weight (100 B) is counted in block 0's param_bytes; blocks 2 and 3 use it too.
    blocks = [Block(name=f"b{k}", modules=(f"m{k}",), flops=1e12, param_bytes=p, out_bytes=0,
                    shared=("w",) if k in (0, 2, 3) else ())
              for k, p in enumerate([110, 10, 10, 10])]
    settings = Settings(optimizer_states=0)  # state copies: weights + gradients = 2
    with_replicas = partition(blocks, 2, settings, {"shared_bytes": {"w": 100}})
    assert [s.memory_bytes for s in with_replicas.stages] == [2 * 120, 2 * (20 + 100)]
    without = partition(blocks, 2, settings, {})
    assert [s.memory_bytes for s in without.stages] == [2 * 120, 2 * 20]
    limited = Settings(optimizer_states=0, memory_limit=2 * 120 + 1)
    assert partition(blocks, 2, limited, {"shared_bytes": {"w": 100}}).stages[1].memory_bytes == 240
