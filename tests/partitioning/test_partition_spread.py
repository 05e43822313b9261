"""Among splits with the least bottleneck the partitioner spreads the work: the stage costs from the largest down are
the least lexicographically (against brute force), so an LM head that sets the bottleneck leaves no stage idle."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from support import REPO

from families.registry import definitions
from partitioning.plan import Block, Plan
from partitioning.solve.partition import Settings, min_max_split, partition

installer = load_script("install_releases")
RELEASE = "5.23.0"  # Llama-3.2 needs transformers >= 4.40; any committed Llama release costs it alike

Table = dict[tuple[int, int, int], float]


@st.composite
def segment_costs(draw: st.DrawFn) -> tuple[int, int, Table, set[tuple[int, int, int]], list[int]]:
    """Any cost per (stage, first, last) segment, some segments not allowed, a weight per cut."""
    n = draw(st.integers(min_value=1, max_value=7))
    k = draw(st.integers(min_value=1, max_value=n))
    # Few distinct values make ties common; 0.1 + 0.2 != 0.3 is a float that differs from 0.3 by one ulp.
    value = st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.1 + 0.2, 1.0, 2.0])
    segments = [(s, i, j) for s in range(k) for i in range(n) for j in range(i, n)]
    cost = {segment: draw(value) for segment in segments}
    banned = {segment for segment in segments if draw(st.integers(0, 9)) == 0}
    return n, k, cost, banned, [draw(st.integers(0, 2)) for _ in range(n)]


@hypothesis_settings(max_examples=400, deadline=None)
@given(segment_costs(), st.booleans())
def test_min_max_split_is_the_least_sorted_cost_vector_then_cut_weight_then_ends(
        problem: tuple[int, int, Table, set[tuple[int, int, int]], list[int]], spread: bool) -> None:
    n, k, cost, banned, weight = problem
    splits = []
    for cuts in itertools.combinations(range(n - 1), k - 1):
        segments = list(zip((0, *(c + 1 for c in cuts)), (*cuts, n - 1)))
        if not any((s, i, j) in banned for s, (i, j) in enumerate(segments)):
            costs = sorted((cost[s, i, j] for s, (i, j) in enumerate(segments)), reverse=True)
            splits.append((costs, sum(weight[c] for c in cuts), segments))
    found = min_max_split(n, k, lambda s, i, j: cost[s, i, j], lambda s, i, j: (s, i, j) not in banned,
                          lambda j: weight[j], spread)
    if not splits:
        assert found is None
        return
    bottleneck = min(costs[0] for costs, _, _ in splits)
    # without spread: any split within the least bottleneck, then the same ties
    expected = min(splits) if spread else min((w, ends) for costs, w, ends in splits if costs[0] == bottleneck)
    assert found == expected[-1]


def llm_chain(layers: int, sublayers: bool) -> list[Block]:
    """Llama-3.2-1B's forward FLOPs per block in proportion (attention 18.55, MLP 49.48, LM head 258.2, embedding
    and norms none), the same bytes over every cut."""
    body = [("attention", 1855), ("mlp", 4948)] if sublayers else [("layer", 1855 + 4948)]
    named = [("embed_tokens", 0), *((f"layers.{i}.{part}", flops) for i in range(layers) for part, flops in body),
             ("norm", 0), ("lm_head", 25820)]
    return [Block(name, (name,), float(flops), 0, 1) for name, flops in named]


def forward_flops(plan: Plan) -> list[float]:
    flops = {block.name: block.flops for block in plan.blocks}
    return [sum(flops[name] for name in stage.blocks) for stage in plan.stages]


@pytest.mark.parametrize("layers,stages,sublayers", [(4, 4, False), (4, 8, True), (16, 8, False)])
def test_an_lm_head_bottleneck_leaves_no_stage_without_work(layers: int, stages: int, sublayers: bool) -> None:
    blocks = llm_chain(layers, sublayers)
    settings = Settings(device_flops=100.0, bandwidth=10.0)
    plan = partition(blocks, stages, settings)
    head = plan.stages[plan.stage_of("lm_head")]
    assert plan.bottleneck == head.cost == 3 * 25820 / 100.0  # the head alone sets it
    assert all(flops > 0 for flops in forward_flops(plan))
    # and it has the least sorted stage costs of every split, costed from the definitions
    n = len(blocks)
    assert plan.loads == min(tuple(sorted((3 * sum(b.flops for b in blocks[i:j + 1]) / 100.0 + (j < n - 1) / 10.0
                                     for i, j in zip((0, *(c + 1 for c in cuts)), (*cuts, n - 1))), reverse=True))
                             for cuts in itertools.combinations(range(n - 1), stages - 1))


@pytest.mark.parametrize("layers,stages", [(4, 4), (4, 8), (16, 8)])
def test_partition_model_gives_every_stage_of_llama_3_2_1b_dims_work(layers: int, stages: int,
                                                                     tmp_path: Path) -> None:
    config = {**definitions()["llama"].shapes["llama-3.2-1b"], "num_hidden_layers": layers, "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = subprocess.run([sys.executable, "-m", "partitioning.cli", "llama", "--version", RELEASE, "--stages",
                             str(stages), "--config", "config.json", "--output", "plan.json"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(installer.install_dir(RELEASE)),
                                                                              str(REPO)])})
    assert result.returncode == 0, result.stderr[-2000:]
    plan = Plan.from_json((tmp_path / "plan.json").read_text())
    assert plan.bottleneck == plan.stages[plan.stage_of("lm_head")].cost  # the LM head sets the bottleneck
    assert all(flops > 0 for flops in forward_flops(plan)), [stage.blocks for stage in plan.stages]
