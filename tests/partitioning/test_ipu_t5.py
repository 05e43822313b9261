"""Generated T5 placed on 2, 4 and 8 IPUs, run on CPU through the poptorch STAND-IN.

The stand-in (tests/poptorch_standin.py) implements BeginBlock's documented
semantics, so these tests prove the annotation logic: which block each module
runs in, in which order blocks start, that annotating changes no output.
They prove nothing about IPU compilation, execution or memory.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from support import poptorch_standin
from support.t5_models import T5, generated, inputs, t5_roles
from transformers import T5Config

from partitioning.cost.chain import family_chain
from partitioning.files import write_outputs
from partitioning.ipu import apply
from partitioning.ipu.codegen import module_expression, render
from partitioning.ipu.config import IPUConfig
from partitioning.ipu.errors import IPUError
from partitioning.ipu.placement import Placement, plan_ipu
from partitioning.ipu.target import placement_files
from partitioning.plan import Block, Plan, Stage
from stateless.torch_internals import forward_hooks, forward_pre_hooks

KEEP = IPUConfig(rebalance_shared=False)  # the plan's stages exactly, as the acceptance asks
FORMS = ("stateful", "stateless")


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Install the stand-in as ``poptorch`` for the test."""
    monkeypatch.setitem(sys.modules, "poptorch", poptorch_standin)
    return poptorch_standin


@pytest.fixture
def no_poptorch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "poptorch", None)  # `import poptorch` fails, as without the Poplar SDK


def t5(form: str, layers: int = 4, seed: int = 0) -> Any:  # a generated T5: attributes mypy cannot see
    config = T5Config(vocab_size=48, d_model=16, d_kv=4, d_ff=24, num_heads=2, relative_attention_num_buckets=8,
                      dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0, num_layers=layers,
                      num_decoder_layers=layers, feed_forward_proj="relu", tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = generated.T5ForConditionalGeneration(config).train()
    return model.make_stateless() if form == "stateless" else model


def t5_plan(model: Any, ipus: int, form: str) -> Plan:  # a model from t5()
    """A plan in the issue's naming: the embedding, each layer, the final norms, the LM head (with the last layers)."""
    layers = len(model.encoder.block)
    stateful = form == "stateful"
    embed = "shared" if stateful else "encoder.embed_tokens"
    weight = "shared.weight" if stateful else "shared_embed_weight"
    names = ([embed] + [f"encoder.block.{i}" for i in range(layers)] + ["encoder.final_layer_norm"]
             + [f"decoder.block.{i}" for i in range(layers)] + ["decoder.final_layer_norm"])
    seen: set[int] = set()
    blocks = []
    for name in names + ["lm_head"]:
        params = [p for p in model.get_submodule(name).parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        size = sum(p.numel() for p in params)
        blocks.append(Block(name, (name,), flops=2.0 * size + 1, param_bytes=4 * size, out_bytes=1024,
                            shared=(weight,) if name in (embed, "lm_head") else ()))
    base, extra = divmod(len(names), ipus)
    groups, start = [], 0
    for index in range(ipus):
        end = start + base + (index >= ipus - extra)  # larger late stages: the decoder starts mid-stage
        groups.append(names[start:end])
        start = end
    groups[-1].append("lm_head")  # never alone: the rule moves it to IPU 0
    by_name = {b.name: b for b in blocks}
    stages = [Stage(i, tuple(g), compute=sum(by_name[n].flops for n in g) / 1e12, communication=0.0,
                    memory_bytes=sum(by_name[n].param_bytes for n in g)) for i, g in enumerate(groups)]
    return Plan({"family": "t5", "version": "4.5.1", "class": "T5ForConditionalGeneration"}, blocks, stages)


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"generated_ipu_{abs(hash(path))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_placement(placement: Placement, code: Path, command: str = "cmd") -> Path:
    """What ``partition-model --target ipu`` writes for ``placement``: the code, and beside it the options file."""
    options = code.with_suffix(".conf")
    write_outputs(placement_files(placement, command, code, options))
    return options


def run(model: torch.nn.Module, kwargs: dict[str, torch.Tensor]) -> torch.Tensor:
    torch.manual_seed(123)  # the same dropout masks for every run
    return model(**kwargs)


class CallLog:
    """The block current at every module call, seen by pre-hooks registered after the BeginBlock hooks."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.calls: list[tuple[int, poptorch_standin.Stage | None]] = []
        self.handles = [m.register_forward_pre_hook(self._record) for m in model.modules()]

    def _record(self, module: torch.nn.Module, args: Any) -> None:
        manager = poptorch_standin.Block._stages_manager
        self.calls.append((id(module), manager.current if manager else None))

    def ipus_of(self, name: str, first_call_only: bool = False) -> dict[str, list[int | None]]:
        """The IPU of each call of ``name`` and of every module inside it."""
        found: dict[str, list[int | None]] = {}
        for inner, module in self.model.get_submodule(name).named_modules(prefix=name):
            ipus = [current[1] if current else None for key, current in self.calls if key == id(module)]
            found[inner] = ipus[:1] if first_call_only else ipus
        return found


def placed(model: torch.nn.Module, apply_with: Any, kwargs: dict[str, torch.Tensor]
           ) -> tuple[torch.Tensor, poptorch_standin.Tracer, CallLog]:
    apply_with(model)
    log = CallLog(model)
    with poptorch_standin.ipu_tracing() as tracer:
        output = run(model, kwargs)
    return output, tracer, log


def shared_users(plan: Plan) -> set[str]:
    return {block.name for block in plan.blocks if block.shared} | {"decoder.embed_tokens"}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("ipus", [2, 4, 8])
def test_generated_parallelize_puts_every_module_where_the_plan_says(standin, tmp_path: Path, ipus: int,
                                                                     form: str) -> None:
    model = t5(form)
    plan = t5_plan(model, ipus, form)
    placement = plan_ipu(plan, KEEP, t5_roles(tied=True, stateless=form == "stateless"))
    write_placement(placement, tmp_path / "ipu_parallelize.py", "partition-model t5 ...")
    code = load(tmp_path / "ipu_parallelize.py")
    kwargs = inputs(masks=True)
    reference = run(model, kwargs)
    reference_logits = run(model, {k: v for k, v in kwargs.items() if k != "labels"})

    loss, tracer, log = placed(model, code.parallelize, kwargs)

    assert torch.equal(loss, reference)
    # The hooks fire exactly as the placement predicts, and PopTorch's pipeline stages (AutoIncrement ids, with
    # neighbours on one IPU merged) never go back, but where a module runs a second time (the stateful embedding).
    visits = placement.visits()
    assert tracer.starts == [(visit.user_id, visit.ipu) for visit in visits]
    ids = [visit.pipeline_stage for visit in visits if not visit.again]
    assert ids == sorted(ids) and set(ids) == set(range(placement.pipeline_stages))
    assert [visit.unit for visit in visits if visit.again] == (["decoder.embed_tokens"] if form == "stateful" else [])
    # Blocks start in ascending plan stage, except the shared weight's users, which go back to IPU 0.
    users = shared_users(plan)
    assert tracer.starts[0] == (plan.stages[0].blocks[0], 0) and tracer.starts[-1] == ("lm_head", 0)
    assert all(ipu == 0 for user_id, ipu in tracer.starts if user_id in users)
    assert all(user_id is not None for user_id, _ in tracer.starts)  # the placement names every block
    stages = [plan.stage_of(user_id) for user_id, _ in tracer.starts if user_id is not None and user_id not in users]
    assert stages == sorted(stages) and set(stages) == set(range(1, ipus))
    # Every module of every block runs on the IPU of its plan stage (stage i on IPU i); the shared weight's users on 0.
    for block in plan.blocks:
        expected = 0 if block.name in users else plan.stage_of(block.name)
        for name in block.modules:
            seen = log.ipus_of(name)
            assert seen[name], name  # containers such as ModuleLists are never called themselves
            for inner, ipus_seen in seen.items():
                assert set(ipus_seen) <= {expected}, (block.name, inner, ipus_seen)
    assert set(log.ipus_of("decoder.embed_tokens")["decoder.embed_tokens"]) == {0}

    with poptorch_standin.ipu_tracing():
        assert torch.equal(run(model, {k: v for k, v in kwargs.items() if k != "labels"}), reference_logits)


@pytest.mark.parametrize("form", FORMS)
def test_deparallelize_removes_every_annotation(standin, tmp_path: Path, form: str) -> None:
    model = t5(form)
    placement = plan_ipu(t5_plan(model, 4, form), IPUConfig(recompute_every_layer=True),
                         t5_roles(tied=True, stateless=form == "stateless"))
    write_placement(placement, tmp_path / "code.py")
    code = load(tmp_path / "code.py")
    hooks = (len(forward_pre_hooks(m)) + len(forward_hooks(m)) for m in model.modules())
    before = sum(hooks)
    code.parallelize(model)
    code.deparallelize(model)
    assert sum(len(forward_pre_hooks(m)) + len(forward_hooks(m)) for m in model.modules()) == before
    with poptorch_standin.ipu_tracing() as tracer:
        run(model, inputs(masks=False))
    assert tracer.starts == [] and tracer.checkpoints == []


def test_generated_code_and_runtime_apply_make_the_same_calls(standin, tmp_path: Path) -> None:
    config = IPUConfig(recompute_every_layer=True)
    models = [t5("stateless"), t5("stateless")]
    placement = plan_ipu(t5_plan(models[0], 4, "stateless"), config, t5_roles(tied=True, stateless=True))
    write_placement(placement, tmp_path / "code.py")
    code = load(tmp_path / "code.py")
    kwargs = inputs(masks=True)
    reference = run(models[0], kwargs)
    out_code, from_code, _ = placed(models[0], code.parallelize, kwargs)
    out_apply, from_apply, _ = placed(models[1], lambda m: apply.parallelize(m, placement), kwargs)
    assert torch.equal(out_code, reference) and torch.equal(out_apply, reference)
    assert from_code.starts == from_apply.starts
    assert from_code.checkpoints == from_apply.checkpoints
    # Checkpoints are taken in every encoder and decoder layer but the last of each, inside the layer's block.
    assert None not in from_apply.checkpoints  # each taken inside a block
    checkpointed = {stage[0] for stage in dict.fromkeys(from_apply.checkpoints) if stage is not None}
    assert placement.recompute == ("encoder.block.0", "encoder.block.1", "encoder.block.2", "decoder.block.0",
                                   "decoder.block.1", "decoder.block.2")
    in_effect = dict(zip((u.name for u in placement.units), placement.in_effect()))

    def user_id(name: str) -> str:
        annotation = in_effect[name]
        assert annotation is not None, name  # a recomputed unit runs in a block
        return annotation.user_id

    assert checkpointed == {user_id(name) for name in placement.recompute}
    apply.deparallelize(models[1])
    assert not any(isinstance(h, apply.RecomputeCheckpoint) for m in models[1].modules()
                   for h in forward_hooks(m).values())


def test_the_partitioners_own_plan_places_and_runs(standin) -> None:
    blocks = pytest.importorskip("families.models")
    partition = pytest.importorskip("partitioning.solve.partition")
    model = t5("stateless")
    chain = family_chain(T5, "T5ForConditionalGeneration", model.config, blocks.MicroBatch(2, {"source": 7, "target": 5}),
                     device="cpu", model=model)
    plan = partition.partition(chain.blocks, 4, partition.Settings(),
                               {"family": "t5", "version": "4.5.1", "config": model.config.to_dict()})
    placement = plan_ipu(plan, IPUConfig(), t5_roles(tied=True, stateless=True))
    kwargs = inputs(masks=True)
    reference = run(model, kwargs)
    loss, tracer, log = placed(model, lambda m: apply.parallelize(m, placement), kwargs)
    assert torch.equal(loss, reference)
    assert tracer.starts == [(visit.user_id, visit.ipu) for visit in placement.visits()]
    stage_of = {name: stage.index for stage in placement.stages for name in stage.blocks}
    for block in plan.blocks:
        expected = 0 if block.shared else stage_of[block.name]
        for name in block.modules:  # the stack dropout runs twice; it belongs where it first runs
            seen = log.ipus_of(name, first_call_only=True)
            assert seen[name] and all(ipus in ([], [expected]) for ipus in seen.values()), block.name


def test_a_placement_for_one_form_refuses_the_other(standin) -> None:
    model = t5("stateful")
    placement = plan_ipu(t5_plan(t5("stateless"), 2, "stateless"), KEEP, t5_roles(tied=True, stateless=True))
    with pytest.raises(IPUError, match="stateless form of the model: call model.make_stateless\\(\\) first"):
        apply.parallelize(model, placement)
    code: dict[str, Any] = {}
    exec(compile(render(placement, "cmd"), "generated", "exec"), code)
    with pytest.raises(ValueError, match="stateless form: call model.make_stateless"):
        code["parallelize"](model)


def test_without_poptorch_planning_and_code_work_and_applying_says_why_not(no_poptorch, tmp_path: Path) -> None:
    model = t5("stateless")
    placement = plan_ipu(t5_plan(model, 4, "stateless"), IPUConfig(), t5_roles(tied=True, stateless=True))
    options = write_placement(placement, tmp_path / "code.py")
    assert "Training.gradientAccumulation" in options.read_text()
    code = load(tmp_path / "code.py")  # importing the generated module needs no poptorch
    with pytest.raises(ImportError, match="poptorch is required: it ships only with Graphcore's Poplar SDK"):
        code.parallelize(model)
    with pytest.raises(IPUError, match="poptorch is required .* Poplar SDK"):
        apply.parallelize(model, placement)
    with pytest.raises(IPUError, match="Poplar SDK"):
        apply.deparallelize(model)


def test_generated_code_spells_out_each_begin_block(tmp_path: Path) -> None:
    model = t5("stateful")
    placement: Placement = plan_ipu(t5_plan(model, 4, "stateful"), KEEP, t5_roles(tied=True, stateless=False))
    text = render(placement, "partition-model t5 --version 4.5.1 --target ipu --ipus 4")
    assert text.startswith("# @generated by partition-model")
    assert "# regenerate: partition-model t5 --version 4.5.1 --target ipu --ipus 4\n" in text
    for annotation in placement.annotations:
        assert (f"    poptorch.BeginBlock({module_expression(annotation.module)}, {annotation.user_id!r}, "
                f"ipu_id={annotation.ipu})\n") in text
    assert "poptorch.BeginBlock(model.encoder.block[1], 'encoder.block.1', ipu_id=1)" in text
    assert "# decoder.embed_tokens is shared, annotated above: block 'shared' starts again there" in text
    assert text.index("'encoder.block.1'") < text.index("'decoder.block.0'") < text.index("'lm_head'")
    compile(text, "generated", "exec")


def test_module_expression_spells_indices_and_falls_back_for_odd_names() -> None:
    assert module_expression("encoder.block.3.layer.0") == "model.encoder.block[3].layer[0]"
    assert module_expression("head.class") == "model.get_submodule('head.class')"


@pytest.mark.parametrize("form", FORMS)
def test_the_projection_is_serialized_as_configured_and_the_loss_is_unchanged(standin, tmp_path: Path,
                                                                               form: str) -> None:
    config = IPUConfig(embedding_serialization_factor=4)
    models = [t5(form), t5(form)]
    placement = plan_ipu(t5_plan(models[0], 4, form), config, t5_roles(tied=True, stateless=form == "stateless"))
    assert placement.serialized == "lm_head"
    write_placement(placement, tmp_path / "code.py")
    code = load(tmp_path / "code.py")
    kwargs = inputs(masks=True)
    reference = run(models[0], kwargs)
    reference.backward()
    grads = {}
    for name, p in models[0].named_parameters():
        assert p.grad is not None, name
        grads[name] = p.grad.clone()
    models[0].zero_grad()
    out_code, from_code, _ = placed(models[0], code.parallelize, kwargs)
    out_apply, from_apply, _ = placed(models[1], lambda m: apply.parallelize(m, placement), kwargs)
    assert torch.equal(out_code, reference) and torch.equal(out_apply, reference)
    out_code.backward()
    assert all(p.grad is not None and torch.equal(p.grad, grads[name]) for name, p in models[0].named_parameters())
    # One serialized matmul per forward, by 4, in the LM head's block on IPU 0.
    assert from_code.serialized == from_apply.serialized == [(("lm_head", 0), 4)]
    code.deparallelize(models[0])
    apply.deparallelize(models[1])
    for model in models:
        assert "forward" not in model.lm_head.__dict__
        with poptorch_standin.ipu_tracing() as tracer:
            run(model, kwargs)
        assert tracer.serialized == []
