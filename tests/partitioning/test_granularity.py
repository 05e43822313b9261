"""Sub-layer blocks merged back into layers equal the layer chain; auto keeps the better plan of the two."""

from __future__ import annotations

import pytest
from support.t5_models import T5, config

from common.errors import UserError
from families.models import MicroBatch
from partitioning.cost import granularity as grain
from partitioning.cost.chain import family_chain
from partitioning.cost.costing import Chain
from partitioning.plan import Plan
from partitioning.solve.baselines import uniform_split
from partitioning.solve.partition import Settings, partition

MB = MicroBatch(2, {"source": 7, "target": 5})
CLASS = "T5ForConditionalGeneration"


def test_merging_sub_layer_blocks_gives_the_layer_chain() -> None:
    cfg = config("2layer-gelu-tied")
    layers = family_chain(T5, CLASS, cfg, MB)
    merged = grain.layer_chain(family_chain(T5, CLASS, cfg, MB, sublayers=True), T5.layer_lists(CLASS))
    assert [(b.name, b.modules) for b in merged.blocks] == [(b.name, b.modules) for b in layers.blocks]
    for mine, theirs in zip(merged.blocks, layers.blocks):
        assert (mine.flops, mine.param_bytes, mine.out_bytes, mine.crossing, mine.shared) == \
            (theirs.flops, theirs.param_bytes, theirs.out_bytes, theirs.crossing, theirs.shared)
        assert mine.activation_bytes >= theirs.activation_bytes  # an upper bound: sub-layers may save one tensor
    assert merged.values == layers.values and merged.shared_bytes == layers.shared_bytes


def test_auto_keeps_the_sub_layer_plan_only_when_it_is_better() -> None:
    chain = family_chain(T5, CLASS, T5.config("t5-small"), T5.micro_batch(4, {"source": 64, "target": 32}), sublayers=True)
    layer_lists = T5.layer_lists(CLASS)
    settings = Settings(bandwidth=25e9)

    def plan_of(candidate: Chain, granularity: str | int) -> Plan:
        return partition(candidate.blocks, stages, settings, {"granularity": granularity}, candidate.values)

    stages = 4
    plan, chosen = grain.choose(chain, layer_lists, plan_of)
    layer_plan = plan_of(grain.layer_chain(chain, layer_lists), 1)
    assert plan.model["granularity"] == grain.SUBLAYER and chosen is chain
    assert plan.bottleneck < layer_plan.bottleneck
    assert any(".layer." in stage.blocks[0] for stage in plan.stages)  # it cuts inside a T5Block
    stages = 1  # one stage: the same plan either way, and a tie keeps whole layers
    plan, chosen = grain.choose(chain, layer_lists, plan_of)
    assert plan.model["granularity"] == 1 and len(chosen.blocks) < len(chain.blocks)
    stages = len(chain.blocks)  # more stages than layer blocks: only the sub-layer chain can
    assert grain.choose(chain, layer_lists, plan_of)[0].model["granularity"] == grain.SUBLAYER


def test_the_uniform_split_of_sub_layer_blocks_is_the_uniform_split_of_layers() -> None:
    cfg = config("3layer-relu-untied-2dec")
    fine = family_chain(T5, CLASS, cfg, MB, sublayers=True).blocks
    coarse = family_chain(T5, CLASS, cfg, MB).blocks
    layer_lists = T5.layer_lists(CLASS)
    for stages in (2, 3):
        starts = [fine[i].first_module for i, _ in uniform_split(fine, stages, layer_lists)]
        expected = [coarse[i].first_module for i, _ in uniform_split(coarse, stages, layer_lists)]
        assert [s.removesuffix(".layer.0") for s in starts] == expected


@pytest.mark.parametrize("text,expected", [("auto", "auto"), ("sublayer", "sublayer"), ("3", 3)])
def test_granularity_flag_values(text: str, expected: str | int) -> None:
    assert grain.parse(text) == expected
    with pytest.raises(UserError, match="granularity must be"):
        grain.parse("0")
