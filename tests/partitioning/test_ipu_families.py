"""Each family's generated model placed by the partitioner's own plan on IPUs, run on CPU through the poptorch
STAND-IN (tests/poptorch_standin.py): the annotation logic only, nothing about IPU compilation or memory.

Family-generic over tests/model_families.py's GENERIC list (T5 has test_ipu_t5.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from support import poptorch_standin
from support.model_checks import Family
from support.model_families import GENERIC
from test_ipu_t5 import load, placed, run, write_placement

from families.models import MicroBatch
from partitioning.cost.chain import family_chain
from partitioning.ipu import apply
from partitioning.ipu.config import IPUConfig
from partitioning.ipu.placement import plan_ipu
from partitioning.ipu.roles import roles_for
from partitioning.solve.partition import Settings, partition


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setitem(sys.modules, "poptorch", poptorch_standin)
    return poptorch_standin


def deepest(family: Family) -> str:
    """The config with the most layers: enough blocks for 4 IPUs besides the shared weight's later users."""
    return max(family.configs, key=lambda name: family.make_config(name).num_hidden_layers)


@pytest.mark.parametrize("form", ["stateless", "stateful"])
@pytest.mark.parametrize("ipus", [2, 4])
@pytest.mark.parametrize("family", GENERIC, ids=lambda f: f.name)
def test_the_partitioners_plan_places_the_shared_weight_users_on_ipu_0_and_runs(
        standin, tmp_path: Path, family: Family, ipus: int, form: str) -> None:
    definition = family.model_family.definition
    class_name = definition.default_class
    config = family.make_config(deepest(family))
    torch.manual_seed(0)
    model = getattr(family.generated, class_name)(config).train()
    if form == "stateless":
        model.make_stateless()
    chain = family_chain(family.model_family, class_name, config, MicroBatch(2, family.train_lengths), device="cpu",
                                      model=model)
    plan = partition(chain.blocks, ipus, Settings(), {"family": family.name, "version": family.version,
                                                      "class": class_name, "config": config.to_dict()})
    roles = roles_for(family.name, class_name, config.to_dict(), stateless=form == "stateless")
    placement = plan_ipu(plan, IPUConfig(), roles)
    write_placement(placement, tmp_path / "ipu_parallelize.py", f"partition-model {family.name} ...")
    code = load(tmp_path / "ipu_parallelize.py")
    assert family.train_batch is not None  # every GENERIC family trains
    kwargs = family.train_batch(config, 2, 3)
    reference = run(model, kwargs)

    loss, tracer, log = placed(model, code.parallelize, kwargs)
    assert torch.equal(loss, reference)
    assert tracer.starts == [(visit.user_id, visit.ipu) for visit in placement.visits()]
    # Every user of the shared weight (the embedding and the tied head) runs on IPU 0, every other block's
    # modules on its stage's IPU.
    (weight,) = definition.shared[class_name]
    users = {block.name for block in plan.blocks if block.shared}
    assert {plan.blocks[0].name, plan.blocks[-1].name} <= users  # the embedding and the LM head
    stage_of = {name: stage.index for stage in placement.stages for name in stage.blocks}
    for block in plan.blocks:
        expected = 0 if block.name in users else stage_of[block.name]
        for name in block.modules:
            seen = log.ipus_of(name, first_call_only=True)
            assert seen[name] and all(ipus_seen in ([], [expected]) for ipus_seen in seen.values()), block.name
    head = weight.tied_linear
    assert head is not None and log.ipus_of(head)[head] == [0]

    # The runtime form of the same placement makes the same calls.
    torch.manual_seed(0)
    again = getattr(family.generated, class_name)(config).train()
    if form == "stateless":
        again.make_stateless()
    _, from_apply, _ = placed(again, lambda m: apply.parallelize(m, placement), kwargs)
    assert from_apply.starts == tracer.starts
