"""Placement of plans on IPUs: the shared-weight rule, its cost, and each PopTorch rule failing."""

from __future__ import annotations

import dataclasses

import pytest
from support.t5_models import t5_roles

from partitioning.ipu.config import IPUConfig
from partitioning.ipu.errors import IPUError
from partitioning.ipu.memory import IPU_MEMORY_BYTES
from partitioning.ipu.placement import Placement, place, plan_ipu, validate
from partitioning.ipu.roles import Roles
from partitioning.plan import Block, Plan, Stage

KEEP = IPUConfig(rebalance_shared=False)  # the plan's stages as they are


def names(encoder: int = 4, decoder: int = 4) -> list[str]:
    return (["shared"] + [f"encoder.block.{i}" for i in range(encoder)] + ["encoder.final_layer_norm"]
            + [f"decoder.block.{i}" for i in range(decoder)] + ["decoder.final_layer_norm", "lm_head"])


def plan_of(groups: list[list[str]], head_flops: float = 1.0, memory: float = 1000.0) -> Plan:
    """A T5-shaped plan: layers cost 10, small blocks 1, the head ``head_flops``; the embedding and head share."""
    def flops(name: str) -> float:
        return head_flops if name == "lm_head" else 10.0 if ".block." in name else 1.0
    blocks = [Block(n, (n,), flops(n), param_bytes=100, out_bytes=10, activation_bytes=100,
                    shared=("shared.weight",) if n in ("shared", "lm_head") else ()) for g in groups for n in g]
    stages = [Stage(i, tuple(g), compute=sum(map(flops, g)), communication=0.0, memory_bytes=int(memory * len(g)))
              for i, g in enumerate(groups)]
    return Plan({"family": "t5", "version": "4.5.1", "class": "T5ForConditionalGeneration"}, blocks, stages)


def four_stages() -> Plan:
    n = names()
    return plan_of([n[0:3], n[3:6], n[6:9], n[9:]])


STATEFUL = t5_roles(tied=True, stateless=False)
# shared e0 e1 | e2 e3 efn d0 d1 | d2 d3 | dfn lm_head: the decoder starts inside stage 1.
MID = [names()[0:3], names()[3:8], names()[8:10], names()[10:]]


def test_lm_head_returns_to_ipu_0_in_a_new_pipeline_stage_and_is_charged_there() -> None:
    placement = plan_ipu(four_stages(), KEEP, STATEFUL)
    head = placement.annotations[-1]
    assert (head.module, head.ipu) == ("lm_head", 0)
    assert [stage.ipu for stage in placement.pipeline()] == [0, 1, 2, 3, 0]
    assert placement.config.gradient_accumulation == 2 * 5 - 1
    costs = placement.ipu_costs()
    head_share = 12.0 * 1.0 / (10 + 1 + 1)  # lm_head's FLOP share of the last stage's compute (12)
    assert costs[0].compute == pytest.approx(costs[0].stage_compute + head_share)
    assert costs[3].compute == pytest.approx(costs[3].stage_compute - head_share)
    # IPU 0 holds the embedding, e0, e1 and the head: 4 blocks of 100 plan bytes (float32) -> 200 in float16.
    assert costs[0].memory.weights == pytest.approx(4 * 100 / 2)
    assert placement.bottleneck == pytest.approx(30.0)  # IPU 2: three decoder layers


def test_stateful_decoder_embedding_starts_the_embedding_block_again_then_resumes() -> None:
    # decoder.block.0 is inside stage 1, so after the decoder's embedding (IPU 0) it needs its own BeginBlock.
    placement = plan_ipu(plan_of(MID), KEEP, STATEFUL)
    visits = [(v.unit, v.user_id, v.ipu, v.again) for v in placement.visits()]
    assert visits == [("shared", "shared", 0, False), ("encoder.block.2", "encoder.block.2", 1, False),
                      ("decoder.embed_tokens", "shared", 0, True), ("decoder.block.0", "decoder.block.0", 1, False),
                      ("decoder.block.2", "decoder.block.2", 2, False),
                      ("decoder.final_layer_norm", "decoder.final_layer_norm", 3, False),
                      ("lm_head", "lm_head", 0, False)]
    assert "back to plan stage 1 after decoder.embed_tokens" in placement.annotations[2].why


def test_stateless_decoder_embedding_gets_its_own_block_on_ipu_0() -> None:
    placement = plan_ipu(plan_of(MID), KEEP, t5_roles(tied=True, stateless=True))
    starts = [(a.module, a.user_id, a.ipu) for a in placement.annotations]
    assert starts[0] == ("encoder.embed_tokens", "shared", 0)  # the plan's `shared` is this module once stateless
    assert starts[2:4] == [("decoder.embed_tokens", "decoder.embed_tokens", 0),
                           ("decoder.block.0", "decoder.block.0", 1)]
    assert placement.pipeline_stages == 7


def test_rebalancing_gives_ipu_0_less_so_the_head_fits_beside_it() -> None:
    n = names(6, 6)
    plan = plan_of([n[0:5], n[5:9], n[9:13], n[13:]], head_flops=30.0)
    kept = plan_ipu(plan, KEEP, STATEFUL)
    rebalanced = plan_ipu(plan, IPUConfig(), STATEFUL)
    assert rebalanced.rebalanced and not kept.rebalanced
    assert rebalanced.bottleneck < kept.bottleneck
    assert len(rebalanced.stages[0].blocks) < len(plan.stages[0].blocks)
    assert sum(c.compute for c in rebalanced.ipu_costs()) == pytest.approx(sum(s.compute for s in plan.stages))


def test_a_last_stage_of_only_the_head_is_idle_unless_rebalanced() -> None:
    n = names()
    plan = plan_of([n[0:4], n[4:8], n[8:11], n[11:]])
    with pytest.raises(IPUError, match="IPU 3 runs nothing once the shared weight's users are moved"):
        plan_ipu(plan, KEEP, STATEFUL)
    assert set(plan_ipu(plan, IPUConfig(), STATEFUL).unit_ipus()) == {0, 1, 2, 3}


def test_layers_per_ipu_overrides_the_plans_stages() -> None:
    n = names(6, 6)
    plan = plan_of([n[0:4], n[4:8], n[8:12], n[12:]])
    placement = plan_ipu(plan, IPUConfig(layers_per_ipu=(0, 3, 4, 5)), STATEFUL)
    assert [s.blocks[0] for s in placement.stages] == ["shared", "encoder.block.0", "encoder.block.3",
                                                       "decoder.block.1"]


def test_recompute_every_layer_checkpoints_block_outputs() -> None:
    placement = plan_ipu(four_stages(), dataclasses.replace(KEEP, recompute_every_layer=True), STATEFUL)
    assert placement.recompute == ("encoder.block.0", "encoder.block.1", "encoder.block.2", "decoder.block.0",
                                   "decoder.block.1", "decoder.block.2")
    with pytest.raises(IPUError, match="recompute_checkpoints names unknown block 'encoder.block.9'"):
        place(four_stages(), IPUConfig(recompute_checkpoints=("encoder.block.9",)), STATEFUL)


def test_one_module_cannot_start_blocks_on_two_ipus() -> None:
    # Without the shared-weight rule the decoder's embedding call (the module `shared`) would belong on IPU 1.
    roles = Roles("stateful", "shared", "call model.make_stateless() first", (),
                  same_module={"decoder.embed_tokens": "shared"},
                  call_sites={"decoder.embed_tokens": "decoder.block.0"})
    plan = plan_of(MID)
    with pytest.raises(IPUError, match="calls shared again, annotated for IPU 0, but must run on IPU 1.*stateless"):
        place(dataclasses.replace(plan, blocks=[dataclasses.replace(b, shared=()) for b in plan.blocks]), KEEP, roles)


# One failing case per rule validate() checks.

def test_rule_begin_blocks_in_execution_order() -> None:
    placement = plan_ipu(four_stages(), KEEP, STATEFUL)
    a = placement.annotations
    swapped = dataclasses.replace(placement, annotations=(a[0], a[2], a[1], *a[3:]))
    with pytest.raises(IPUError, match="'encoder.block.2' .* is declared after 'decoder.block.0' .* but runs before "
                                       "it: declare BeginBlocks in execution order"):
        validate(swapped)


def test_rule_ipu_count_is_a_power_of_two_unless_auto_rounded() -> None:
    n = names()
    plan = plan_of([n[0:4], n[4:9], n[9:]])
    with pytest.raises(IPUError, match="3 IPUs x 1 replicas = 3 IPUs, not a power of two.*auto_round_num_ipus"):
        plan_ipu(plan, KEEP, STATEFUL)
    assert plan_ipu(plan, dataclasses.replace(KEEP, auto_round_num_ipus=True), STATEFUL).ipus == 3
    with pytest.raises(IPUError, match="4 IPUs x 3 replicas = 12 IPUs"):
        plan_ipu(four_stages(), dataclasses.replace(KEEP, replication_factor=3), STATEFUL)


def test_rule_gradient_accumulation_covers_forward_and_backward_stages() -> None:
    with pytest.raises(IPUError, match=r"gradient_accumulation 8 is below 9, .*\(2x5-1\): set gradient_accumulation "
                                       r">= 9"):
        plan_ipu(four_stages(), dataclasses.replace(KEEP, gradient_accumulation=8), STATEFUL)
    assert plan_ipu(four_stages(), dataclasses.replace(KEEP, gradient_accumulation=9), STATEFUL)


def test_rule_device_iterations_cover_the_stages_in_pipelined_inference() -> None:
    config = dataclasses.replace(KEEP, training=False, inference_execution="pipelined", device_iterations=4)
    with pytest.raises(IPUError, match="device_iterations 4 is below the 5 pipeline stages.*>= 5"):
        plan_ipu(four_stages(), config, STATEFUL)
    # Sharded execution runs one stage at a time: PopTorch sets no such minimum.
    assert plan_ipu(four_stages(), dataclasses.replace(config, inference_execution="sharded"), STATEFUL)


def test_rule_shared_weight_users_on_one_ipu() -> None:
    placement = plan_ipu(four_stages(), KEEP, STATEFUL)
    moved = dataclasses.replace(placement.annotations[-1], ipu=3)
    with pytest.raises(IPUError, match="shared.weight is used on several IPUs \\(shared on IPU 0, "
                                       "decoder.embed_tokens on IPU 0, lm_head on IPU 3\\).*for IPU 0"):
        validate(dataclasses.replace(placement, annotations=(*placement.annotations[:-1], moved)))


def test_rule_per_ipu_lists_have_one_entry_per_ipu() -> None:
    with pytest.raises(IPUError, match="available_memory_proportion lists 3 values for 4 IPUs"):
        plan_ipu(four_stages(), dataclasses.replace(KEEP, available_memory_proportion=(0.5, 0.5, 0.5)), STATEFUL)
    placement = plan_ipu(four_stages(), IPUConfig(layers_per_ipu=(-1, -1, -1, -1)), STATEFUL)
    with pytest.raises(IPUError, match="layers_per_ipu lists 2 IPUs but the placement uses 4"):
        validate(dataclasses.replace(placement, config=dataclasses.replace(placement.config, layers_per_ipu=(4, 4))))


def test_rule_layers_per_ipu_sums_to_the_models_layers() -> None:
    with pytest.raises(IPUError, match="places 9 layers but the model has 8"):
        plan_ipu(four_stages(), IPUConfig(layers_per_ipu=(1, 2, 3, 3)), STATEFUL)


def test_rule_each_ipu_fits_in_mk2_memory_naming_the_term_that_overflows() -> None:
    n = names()
    plan = plan_of([n[0:3], n[3:6], n[6:9], n[9:]])
    big = int(IPU_MEMORY_BYTES * 0.4)  # float32 bytes per block: three such blocks' weights are 60% of an IPU in fp16
    plan.blocks[:] = [dataclasses.replace(b, param_bytes=big if ".block." in b.name else 100) for b in plan.blocks]
    offchip = dataclasses.replace(KEEP, optimizer_state_offchip=True)
    # IPU 2 runs three big decoder blocks: 3 x (188 MB of float16 weights + 188 MB of accumulators).
    with pytest.raises(IPUError, match=r"IPU 2 needs 1128.\d MB but a Mk2 IPU has 940.6 MB; the largest term is "
                                       r"weights \(564.\d MB; all in MB: weights 564.\d, gradient accumulators "
                                       r"564.\d\); 1 of 4 IPUs are over: use more IPUs"):
        plan_ipu(plan, offchip, STATEFUL)
    # The same weights with the accumulators in float32 and Adam's state on chip: the optimizer state is named.
    plan.blocks[:] = [dataclasses.replace(b, param_bytes=big // 4 if ".block." in b.name else 100) for b in plan.blocks]
    on_chip = dataclasses.replace(KEEP, enable_half_first_order_momentum=False)  # Adam's state: 8 bytes a weight
    with pytest.raises(IPUError, match="the largest term is optimizer state .* set optimizer_state_offchip"):
        plan_ipu(plan, on_chip, STATEFUL)
    assert plan_ipu(plan, dataclasses.replace(on_chip, optimizer_state_offchip=True), STATEFUL)


def test_rule_ipus_per_replica_matches_the_plan() -> None:
    with pytest.raises(IPUError, match="ipus_per_replica is 8 but the placement uses 4 IPUs"):
        plan_ipu(four_stages(), dataclasses.replace(KEEP, ipus_per_replica=8), STATEFUL)


def test_placement_is_data_validate_rechecks_it() -> None:
    placement = plan_ipu(four_stages(), KEEP, STATEFUL)
    assert isinstance(placement, Placement)
    doubled = dataclasses.replace(placement, annotations=placement.annotations + (placement.annotations[0],))
    with pytest.raises(IPUError, match="already starts a block"):
        validate(doubled)


def test_a_shared_weight_user_inside_a_block_module_counts_as_that_block_using_it() -> None:
    # BERT-like: the tied word embeddings sit inside the "embeddings" block; the plan names no shared weight.
    names = ["embeddings", "encoder.layer.0", "encoder.layer.1", "cls"]
    blocks = [Block(n, ("bert." + n if n != "cls" else n,), 10.0, param_bytes=100, out_bytes=10) for n in names]
    stages = [Stage(i, (n,), compute=10.0, communication=0.0, memory_bytes=100) for i, n in enumerate(names[:3])]
    stages[-1] = Stage(2, ("encoder.layer.1", "cls"), compute=20.0, communication=0.0, memory_bytes=200)
    roles = Roles("stateless", "w", "hint", ("bert.encoder.layer",),
                  {"w": ("bert.embeddings.word_embeddings", "cls.predictions.decoder")})
    placement = place(Plan({}, blocks, stages), KEEP, roles)
    assert placement.shared == {"w": (0, 3)}
    assert placement.annotations[-1].module == "cls" and placement.annotations[-1].ipu == 0


def test_the_gpu_pipelines_replica_of_a_shared_weight_is_not_charged_to_the_ipu_that_owns_it() -> None:
    """A GPU plan charges a later user's stage a replica of the shared weight; on IPUs the user runs where the
    weight lives, so the replica's bytes belong to no block (GPT-2's 154 MB embedding was counted twice)."""
    from partitioning.ipu.costs import block_shares

    plan = four_stages()
    plan.model["shared_bytes"] = {"shared.weight": 600}
    plan.settings.update(optimizer_states=0, master_weights=False)
    unreplicated = plan_ipu(plan, KEEP, STATEFUL).ipu_costs()[0].memory_bytes
    # Stage 3 (decoder.final_layer_norm, lm_head) holds 2 x 600 bytes of replica (weights + gradients, no
    # optimizer state) on top of its blocks' 2 x 1000 bytes.
    last = plan.stages[3]
    plan.stages[3] = dataclasses.replace(last, memory_bytes=last.memory_bytes + 2 * 600)
    shares = block_shares(plan)
    assert shares["lm_head"].memory_bytes == pytest.approx(1000)
    assert shares["decoder.final_layer_norm"].memory_bytes == pytest.approx(1000)
    assert shares["shared"].memory_bytes == pytest.approx(1000)  # the owner's stage holds no replica
    # IPU memory is modelled from the blocks' own bytes (partitioning/ipu/memory.py), never from the GPU stage's.
    assert plan_ipu(plan, KEEP, STATEFUL).ipu_costs()[0].memory_bytes == pytest.approx(unreplicated)


def test_a_moved_block_is_charged_once_however_many_names_its_weight_has() -> None:
    """GPT-2's stateless plan names its embedding weight both as costed and as the form's parameter: the head was
    charged twice to IPU 0 while re-splitting, so any split under twice its cost looked as good
    (layers_per_ipu [0, 1, 3, 8] instead of optimum-graphcore's [0, 4, 4, 4])."""
    from partitioning.ipu.costs import rebalance

    n = names()
    plan = plan_of([n[0:3], n[3:6], n[6:9], n[9:]], head_flops=30.0)
    once = rebalance(plan, 4, [["shared", "lm_head"]], lambda *args: True)
    twice = rebalance(plan, 4, [["shared", "lm_head"], ["shared", "lm_head"]], lambda *args: True)
    assert twice == once
    assert once[0] == ("shared",)  # the head's 30 already make IPU 0 the busiest: it keeps nothing else
