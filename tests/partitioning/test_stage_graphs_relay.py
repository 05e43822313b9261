"""relay_along_chain with a value read by three or more stages: every later consumer reads the relayed copy.

A 4-stage GPT-2 passes a value from stage 0 to every later stage.  The engine refuses a stage output that needs
a gradient and goes to more than one stage ("Backward of skip connections not supported yet"), which is what
the relay prevents: before the fix the third consumer kept reading stage 0's output (train-model failed on any
4-stage GPT-2).  Traced on ``meta`` in this process, no ranks.
"""

from __future__ import annotations

from torch.distributed.pipelining import Pipe

from families.family import ModelFamily
from families.loading import build_meta
from families.models import make_inputs
from partitioning.cost import granularity as grain
from partitioning.cost.chain import family_chain
from partitioning.gpu.pipelining import CarryInputs, split_spec
from partitioning.gpu.recompute_graph import Recomputation, recompute_policy
from partitioning.gpu.stage_graphs import relay_along_chain
from partitioning.solve.partition import Settings, build_plan
from partitioning.train.stage import plan_model
from stateless.torch_internals import annotate_split_points


def test_a_value_read_by_every_stage_goes_to_one_stage_at_a_time() -> None:
    family = ModelFamily.load("gpt2", "4.5.1")
    class_name = family.definition.default_class
    config = family.config("tiny")
    config.n_layer = 6
    micro_batch = family.micro_batch(1, {"sequence": 8})
    layers = grain.layer_chain(family_chain(family, class_name, config, micro_batch), family.layer_lists(class_name))
    count = len(layers.blocks)  # embed, 6 layers, final norm, lm_head
    plan = build_plan(layers.blocks, [(0, 1), (2, 3), (4, 5), (6, count - 1)], Settings(micro_batches=4),
                      family.describe(class_name, config, micro_batch, "tiny", 1), values=layers.values)
    model = build_meta(family, class_name, config).model
    _, _, _, specs, _ = plan_model(plan)
    example = {k: v.to("meta") for k, v in make_inputs(specs, config, micro_batch, "cpu").items()}
    wrapped = CarryInputs(model, tuple(example))
    annotate_split_points(wrapped, split_spec(plan, model, "model."))
    pipe = Pipe.from_tracing(wrapped, tuple(example.values()), split_policy=recompute_policy(plan, "model.",
                                                                                            Recomputation()))
    relay_along_chain(pipe.split_gm)
    stages = [node for node in pipe.split_gm.graph.nodes if node.op == "call_module"]
    for stage in stages:
        for value in stage.users:
            readers = [user for user in value.users if user in stages]
            assert len(readers) <= 1, (stage.name, value.name, [r.name for r in readers])
    # each middle stage passes what later stages read on beside its own output
    assert all(len(stage.users) >= 2 for stage in stages[1:-1])
