"""Block chains and their costs: FLOPs, parameters, crossing tensors, saved activations, on meta and real devices."""

from __future__ import annotations

import pytest
import torch
from support.t5_models import CLASSES, T5, config
from torch.utils.flop_counter import FlopCounterMode

from common.errors import UserError
from families.definition import ChainEntry
from families.models import MicroBatch
from partitioning.cost.blocks import chain_specs
from partitioning.cost.chain import block_specs, family_chain
from partitioning.cost.costing import BlockSpec, cost_chain

MB = MicroBatch(batch=2, lengths={"source": 7, "target": 5})


@pytest.mark.parametrize("config_name", ["1layer-relu-tied", "2layer-gelu-untied"])
@pytest.mark.parametrize("class_name", CLASSES)
def test_meta_costs_equal_real_costs_exactly(class_name: str, config_name: str) -> None:
    on_meta = family_chain(T5, class_name, config(config_name), MB, device="meta")
    on_cpu = family_chain(T5, class_name, config(config_name), MB, device="cpu")
    assert on_meta.blocks == on_cpu.blocks  # FLOPs, parameters, crossing and saved bytes, names
    assert on_meta.total_flops == on_cpu.total_flops > 0


def test_block_flops_are_flop_counter_per_module_counts_and_add_up_to_the_model() -> None:
    cfg = config("3layer-relu-untied-2dec")
    torch.manual_seed(0)
    model = T5.build("T5ForConditionalGeneration", cfg, device="cpu")
    chain = family_chain(T5, "T5ForConditionalGeneration", cfg, MB, model=model)
    with FlopCounterMode(display=False) as counter:
        model(**T5.inputs("T5ForConditionalGeneration", cfg, MB, "cpu"))
    per_module = {name.removeprefix("T5ForConditionalGeneration."): sum(ops.values())
                  for name, ops in counter.get_flop_counts().items()}
    assert sum(block.flops for block in chain.blocks) == counter.get_total_flops() == chain.total_flops
    for block in chain.blocks:
        assert block.flops == sum(per_module.get(module, 0) for module in block.modules), block.name
    assert chain.blocks[1].flops > 0 and chain.blocks[0].flops == 0  # a T5Block computes, the embedding looks up


def test_t5_block_flops_match_the_analytic_count_on_a_large_meta_shape() -> None:
    """t5-3b is costed on meta with no parameter memory; its encoder layer matches 2*m*n*k per matmul."""
    cfg = T5.config("t5-3b")
    mb = MicroBatch(batch=1, lengths={"source": 16, "target": 8})
    source = mb.lengths["source"]
    chain = family_chain(T5, "T5ForConditionalGeneration", cfg, mb)
    tokens, inner = mb.batch * source, cfg.num_heads * cfg.d_kv
    projections = 2 * tokens * (4 * cfg.d_model * inner + 2 * cfg.d_model * cfg.d_ff)
    attention = 2 * 2 * mb.batch * cfg.num_heads * source ** 2 * cfg.d_kv  # scores and weighted values
    by_name = {block.name: block for block in chain.blocks}
    assert by_name["encoder.block.7"].flops == projections + attention
    assert len(chain.blocks) == 2 * 24 + 5


@pytest.mark.parametrize("config_name,tied", [("1layer-relu-tied", True), ("2layer-gelu-untied", False)])
def test_shared_weight_is_counted_once_at_its_first_user(config_name: str, tied: bool) -> None:
    cfg = config(config_name)
    model = T5.build("T5ForConditionalGeneration", cfg, device="cpu")
    chain = family_chain(T5, "T5ForConditionalGeneration", cfg, MB, model=model)
    unique_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert sum(block.param_bytes for block in chain.blocks) == unique_bytes
    by_name = {block.name: block for block in chain.blocks}
    embedding = cfg.vocab_size * cfg.d_model * 4
    assert by_name["encoder.embed"].param_bytes == embedding
    assert by_name["encoder.embed"].shared == by_name["decoder.embed"].shared == ("shared.weight",)
    assert by_name["decoder.embed"].param_bytes == 0
    assert chain.shared_bytes == {"shared.weight": embedding}
    assert by_name["lm_head"].shared == (("shared.weight",) if tied else ())
    assert by_name["lm_head"].param_bytes == (0 if tied else embedding)


def test_every_tensor_crossing_a_cut_is_counted() -> None:
    """Hand-derived: what T5 carries over each kind of cut (fp32 activations, int64 ids and masks)."""
    cfg = config("2layer-gelu-untied")
    b, s, t, d, h = MB.batch, MB.lengths["source"], MB.lengths["target"], cfg.d_model, cfg.num_heads
    ids_s, ids_t = b * s * 8, b * t * 8
    chain = family_chain(T5, "T5ForConditionalGeneration", cfg, MB)
    by_name = {block.name: block for block in chain.blocks}
    passed_through = ids_s + 3 * ids_t  # attention mask, decoder ids and mask, labels
    # after the embedding: hidden states and the encoder's extended mask (b, 1, 1, s) in fp32
    assert by_name["encoder.embed"].out_bytes == passed_through + b * s * d * 4 + b * s * 4
    # between encoder layers: hidden states and the position bias with the mask folded in
    assert by_name["encoder.block.0"].out_bytes == passed_through + b * s * d * 4 + b * h * s * s * 4
    # between decoder layers: the encoder output, both position biases, the labels for the loss
    assert by_name["decoder.block.0"].out_bytes == ids_t + (b * s * d + b * t * d + b * h * t * t + b * h * t * s) * 4
    assert by_name["decoder.final"].out_bytes == ids_t + b * t * d * 4
    assert by_name["lm_head"].out_bytes == 0 and by_name["lm_head"].crossing == ()
    labels = [entry for entry in by_name["decoder.block.1"].crossing if entry.startswith("labels:")]
    assert labels == [f"labels: int64[{b}, {t}]"]


def test_granularity_groups_layers_and_keeps_costs_additive() -> None:
    cfg = config("3layer-relu-untied-2dec")
    fine = family_chain(T5, "T5Model", cfg, MB)
    coarse = family_chain(T5, "T5Model", cfg, MB, layers_per_block=2)
    assert [b.name for b in coarse.blocks] == ["encoder.embed", "encoder.block.0-1", "encoder.block.2",
                                               "encoder.final", "decoder.embed", "decoder.block.0-1", "decoder.final"]
    assert coarse.blocks[1].modules == ("encoder.block.0", "encoder.block.1")
    fine_by_name = {b.name: b for b in fine.blocks}
    assert coarse.blocks[1].flops == fine_by_name["encoder.block.0"].flops + fine_by_name["encoder.block.1"].flops
    assert coarse.blocks[1].out_bytes == fine_by_name["encoder.block.1"].out_bytes
    with pytest.raises(UserError, match="at least 1 layer"):
        block_specs(T5, "T5Model", T5.build("T5Model", cfg), 0)


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(4, 8, bias=False), torch.nn.Linear(8, 3, bias=False)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x))) * keep


def test_costs_of_a_hand_checkable_chain() -> None:
    """The relu runs before ``down`` is called, so it is glue code of block ``up`` (where a pipeline cuts too)."""
    model = _Mlp()
    x, keep = torch.randn(5, 4), torch.ones(5, 3)
    chain = cost_chain(model, [BlockSpec("up", ("up",)), BlockSpec("down", ("down",))], {"x": x, "keep": keep}, {})
    up, down = chain.blocks
    assert (up.flops, down.flops) == (2 * 5 * 4 * 8, 2 * 5 * 8 * 3)
    assert (up.param_bytes, down.param_bytes) == (4 * 8 * 4, 8 * 3 * 4)
    assert up.out_bytes == 5 * 8 * 4 + 5 * 3 * 4  # the relu output and the passed-through ``keep``
    assert up.crossing == ("keep: float32[5, 3]", "relu: float32[5, 8]")
    # x (the weight's gradient needs it) and the relu output; the weight is parameter bytes
    assert up.activation_bytes == 5 * 4 * 4 + 5 * 8 * 4
    # the relu output again (``down`` saves it too: counted per block) and ``keep`` for the product's
    # gradient; down's output is not kept, as ``keep`` needs no gradient
    assert down.activation_bytes == 5 * 8 * 4 + 5 * 3 * 4
    assert down.out_bytes == 0


def test_measured_wall_time_on_a_real_device_and_not_on_meta() -> None:
    chain = family_chain(T5, "T5EncoderModel", config("1layer-relu-tied"), MB, device="cpu", measure_repeats=2)
    assert all(block.seconds is not None and block.seconds > 0 for block in chain.blocks)
    with pytest.raises(UserError, match="meta"):
        family_chain(T5, "T5EncoderModel", config("1layer-relu-tied"), MB, device="meta", measure_repeats=1)


def test_bad_specs_and_inputs_are_plan_errors() -> None:
    model = T5.build("T5EncoderModel", config("1layer-relu-tied"))
    kwargs = T5.inputs("T5EncoderModel", model.config, MB, "meta")
    absent = {"inputs_embeds": None}
    with pytest.raises(UserError, match="no module 'encoder.nope'"):
        cost_chain(model, [BlockSpec("a", ("encoder.embed_tokens",)), BlockSpec("b", ("encoder.nope",))], kwargs,
                   absent)
    with pytest.raises(UserError, match="does not run before"):  # out of execution order
        cost_chain(model, [BlockSpec("a", ("encoder.final_layer_norm",)), BlockSpec("b", ("encoder.block.0",))],
                   kwargs, absent)
    with pytest.raises(UserError, match="never runs"):
        cost_chain(model, [BlockSpec("a", ("encoder.embed_tokens",)), BlockSpec("b", ("encoder.final_layer_norm",)),
                           BlockSpec("c", ("encoder.block.0",))], kwargs, absent)
    with pytest.raises(UserError, match="unknown class"):
        T5.build("T5ForSomething", model.config)
    with pytest.raises(UserError, match="positive"):
        MicroBatch(0, {"source": 4, "target": 4})


def test_an_optional_module_a_class_lacks_leaves_the_block_without_it() -> None:
    """GPT-2's loss module is a function from 4.51 on: the block is its lm_head alone; a required module missing
    is still refused."""
    model = torch.nn.ModuleDict({"head": torch.nn.Linear(2, 2)})
    entry = ChainEntry(name="head", modules=("head", "loss"), root=True, optional=("loss",))
    assert [spec.modules for spec in chain_specs([entry], model)] == [("head",)]
    model["loss"] = torch.nn.CrossEntropyLoss()
    assert [spec.modules for spec in chain_specs([entry], model)] == [("head", "loss")]
    with pytest.raises(UserError, match="the model has head but no norm"):
        chain_specs([ChainEntry(name="head", modules=("head", "norm", "loss"), root=True, optional=("loss",))],
                    torch.nn.ModuleDict({"head": torch.nn.Linear(2, 2)}))
