"""The baseline splits (optimum-graphcore uniform layers, DeepSpeed parameters) and placement export."""

from __future__ import annotations

import functools
import itertools

import pytest
from support.t5_models import T5, config

from common.errors import UserError
from families.models import MicroBatch, SharedWeight
from partitioning.cost.chain import family_chain
from partitioning.cost.costing import Chain
from partitioning.gpu.module_to_device import module_to_device
from partitioning.plan import Block
from partitioning.solve.baselines import parameter_balanced_split, parameter_counts, uniform_split
from partitioning.solve.partition import Settings, build_plan, partition

LISTS = T5.layer_lists("T5ForConditionalGeneration")  # encoder.block, decoder.block


def t5_like(encoder: int, decoder: int) -> list[Block]:
    names = (["encoder.embed"] + [f"encoder.block.{i}" for i in range(encoder)] + ["encoder.final", "decoder.embed"]
             + [f"decoder.block.{i}" for i in range(decoder)] + ["decoder.final", "lm_head"])
    return [Block(name, (name,), 1.0, 1, 0) for name in names]


def layers_per_stage(blocks: list[Block], segments: list[tuple[int, int]]) -> list[int]:
    return [sum(".block." in b.name for b in blocks[i:j + 1]) for i, j in segments]


@pytest.mark.parametrize("encoder,decoder,stages,expected", [
    (6, 6, 4, [3, 3, 3, 3]),
    (7, 7, 4, [3, 3, 3, 5]),  # optimum-graphcore puts the remainder on the last IPU
    (6, 6, 8, [1, 1, 1, 1, 1, 1, 1, 5]),
    (3, 0, 1, [3]),
])
def test_uniform_split_spreads_layers_like_layers_per_ipu_wildcards(encoder: int, decoder: int, stages: int,
                                                                    expected: list[int]) -> None:
    blocks = t5_like(encoder, decoder)
    segments = uniform_split(blocks, stages, LISTS)
    assert layers_per_stage(blocks, segments) == expected
    assert segments[0][0] == 0 and segments[-1][1] == len(blocks) - 1  # embedding first, head last
    assert all(end + 1 == start for (_, end), (start, _) in zip(segments, segments[1:]))


def test_uniform_split_keeps_non_layer_blocks_with_the_layer_before_them() -> None:
    blocks = t5_like(2, 2)
    segments = uniform_split(blocks, 2, LISTS)
    assert [[b.name for b in blocks[i:j + 1]] for i, j in segments] == [
        ["encoder.embed", "encoder.block.0", "encoder.block.1", "encoder.final", "decoder.embed"],
        ["decoder.block.0", "decoder.block.1", "decoder.final", "lm_head"]]
    with pytest.raises(UserError, match="4 layers, 5 stages"):
        uniform_split(blocks, 5, LISTS)


def test_parameter_counts_charge_a_tied_weight_at_every_user() -> None:
    blocks = [Block("a", ("a",), 0.0, 10, 0, shared=("w",)), Block("b", ("b",), 0.0, 5, 0),
              Block("c", ("c",), 0.0, 0, 0, shared=("w",))]
    assert parameter_counts(blocks, {"w": 7}) == [10, 5, 7]


def test_parameter_balanced_split_is_the_most_balanced_parameter_split() -> None:
    weights = [9, 1, 1, 1, 4, 4, 1, 8]
    blocks = [Block(f"b{i}", (f"b{i}",), 0.0, w, 0) for i, w in enumerate(weights)]
    for stages in range(1, len(weights) + 1):
        segments = parameter_balanced_split(blocks, stages, {})
        best = min(max(sum(weights[i:j]) for i, j in zip((0, *cuts), (*cuts, len(weights))))
                   for cuts in itertools.combinations(range(1, len(weights)), stages - 1))
        assert max(sum(weights[i:j + 1]) for i, j in segments) == best


@functools.cache
def t5_small() -> Chain:
    return family_chain(T5, "T5ForConditionalGeneration", T5.config("t5-small"), MicroBatch(2, {"source": 64, "target": 32}))


@pytest.mark.parametrize("stages", [2, 4, 8])
def test_optimal_plan_is_never_worse_than_either_baseline_on_t5_small(stages: int) -> None:
    chain = t5_small()
    settings = Settings(device_flops=50e12, bandwidth=50e9, micro_batches=4)
    ours = partition(chain.blocks, stages, settings)
    for segments in (uniform_split(chain.blocks, stages, LISTS),
                     parameter_balanced_split(chain.blocks, stages, chain.shared_bytes)):
        baseline = build_plan(chain.blocks, segments, settings, {})
        assert ours.bottleneck <= baseline.bottleneck
        assert ours.ideal == pytest.approx(baseline.ideal, rel=1e-12)  # stage sums differ only by rounding


def test_module_to_device_places_every_block_module_and_the_root() -> None:
    cfg = config("1layer-relu-tied")
    model = T5.build("T5ForConditionalGeneration", cfg)
    chain = family_chain(T5, "T5ForConditionalGeneration", cfg, MicroBatch(2, {"source": 7, "target": 5}), model=model)
    names = [b.name for b in chain.blocks]
    segments = [(0, names.index("encoder.final")), (names.index("decoder.embed"), len(names) - 1)]
    plan = build_plan(chain.blocks, segments, Settings(), {})
    placement = module_to_device(plan)
    assert placement[""] == "cuda:0"
    assert placement["encoder.block.0"] == "cuda:0" and placement["decoder.block.0"] == "cuda:1"
    assert placement["decoder.embed_tokens"] == placement["lm_head"] == placement["loss_fct"] == "cuda:1"
    # stock layout: one embedding module under three names lives where it first runs
    aliased = module_to_device(plan, model=model)
    assert aliased["shared"] == aliased["encoder.embed_tokens"] == aliased["decoder.embed_tokens"] == "cuda:0"
    # stateless layout: the decoder's embedding is its own module and follows its stage
    assert isinstance(model, SharedWeight)
    stateless = module_to_device(plan, model=model.make_stateless(), prefix="cpu")
    assert stateless["decoder.embed_tokens"] == "cpu:1" and "shared" not in stateless
