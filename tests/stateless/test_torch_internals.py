"""stateless/torch_internals.py: every private torch name the project reaches, each named by the test that uses it.

A torch release that renames, removes or reshapes one of them fails here, in the test named after it,
before it fails anywhere in the runtime.  The engine's stages and schedules run for real on a
one-rank gloo group (a one-stage pipeline needs no messages).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    Pipe,
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    SplitPoint,
    _backward,
    schedules,
    stage,
)
from torch.nn.parallel import DistributedDataParallel

from stateless import torch_internals as internals


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A one-rank gloo process group for the test, taken down after it."""
    assert not dist.is_initialized(), "another test left a process group behind"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# -- nn.Module's own tables ---------------------------------------------------------------------------
def test_own_parameters_is_the_live_parameters_table() -> None:
    """``nn.Module._parameters``: deleting an entry unregisters the parameter."""
    linear = nn.Linear(2, 3)
    table = internals.own_parameters(linear)
    assert table is linear._parameters and list(table) == ["weight", "bias"] and table["weight"] is linear.weight
    del table["bias"]
    assert [name for name, _ in linear.named_parameters()] == ["weight"]


def test_own_buffers_is_the_live_buffers_table() -> None:
    """``nn.Module._buffers``: an entry set there is a buffer of the module."""
    norm = nn.BatchNorm1d(3)
    table = internals.own_buffers(norm)
    assert table is norm._buffers and table["running_mean"] is norm.running_mean
    table["running_mean"] = torch.ones(3)
    assert torch.equal(dict(norm.named_buffers())["running_mean"], torch.ones(3))


def test_own_children_and_their_order() -> None:
    """``nn.Module._modules``: its order is the order ``named_children`` and ``state_dict`` follow."""
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    children = internals.own_children(model)
    assert children is model._modules and list(children) == ["0", "1"]
    internals.set_own_children(model, {"1": children["1"], "0": children["0"]})
    assert [name for name, _ in model.named_children()] == ["1", "0"]
    assert list(model.state_dict()) == ["0.weight", "0.bias"]


def test_non_persistent_buffers() -> None:
    """``nn.Module._non_persistent_buffers_set``: the buffers ``state_dict`` leaves out."""
    module = nn.Module()
    module.register_buffer("kept", torch.zeros(1))
    module.register_buffer("dropped", torch.zeros(1), persistent=False)
    assert internals.non_persistent_buffers(module) is module._non_persistent_buffers_set
    assert internals.non_persistent_buffers(module) == {"dropped"} and list(module.state_dict()) == ["kept"]


def test_forward_hooks_by_handle_id() -> None:
    """``nn.Module._forward_hooks``: deleting an entry removes the hook."""
    linear = nn.Linear(2, 2)
    handle = linear.register_forward_hook(lambda module, args, output: output * 0)
    hooks = internals.forward_hooks(linear)
    assert hooks is linear._forward_hooks and list(hooks) == [handle.id]
    assert not linear(torch.ones(1, 2)).any()
    del hooks[handle.id]
    assert torch.equal(linear(torch.ones(1, 2)), torch.ones(1, 2) @ linear.weight.T + linear.bias)


def test_forward_pre_hooks_by_handle_id() -> None:
    """``nn.Module._forward_pre_hooks``: the hooks run before ``forward``, by handle id."""
    linear = nn.Linear(2, 2)
    handle = linear.register_forward_pre_hook(lambda module, args: (args[0] * 0,))
    hooks = internals.forward_pre_hooks(linear)
    assert hooks is linear._forward_pre_hooks and list(hooks) == [handle.id]
    assert torch.equal(linear(torch.ones(1, 2)), linear.bias.expand(1, 2))


def test_load_state_dict_pre_hook_gets_the_state_dict_first() -> None:
    """``nn.Module._register_load_state_dict_pre_hook``: ``hook(state_dict, prefix, ...)``, no module argument."""
    source, target = nn.Linear(2, 2), nn.Linear(2, 2)

    def rename(state_dict: dict, prefix: str, *rest: object) -> None:
        for key in [key for key in state_dict if key.startswith(prefix + "old_")]:
            state_dict[prefix + key.removeprefix(prefix + "old_")] = state_dict.pop(key)

    handle = internals.register_load_state_dict_pre_hook(target, rename)
    target.load_state_dict({"old_" + key: value for key, value in source.state_dict().items()})
    assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)
    handle.remove()
    with pytest.raises(RuntimeError, match="Missing key"):
        target.load_state_dict({"old_" + key: value for key, value in source.state_dict().items()})


# -- tensors, ops and autograd --------------------------------------------------------------------------
def test_view_base() -> None:
    """``Tensor._base``: the tensor a view was made from; None for one that owns its storage."""
    whole = torch.zeros(4)
    assert internals.view_base(whole[1:]) is whole and internals.view_base(whole) is None


def test_storage_id_is_one_per_storage() -> None:
    """``UntypedStorage._cdata``: views share it, a copy has its own."""
    whole = torch.zeros(4)
    assert internals.storage_id(whole[1:]) == internals.storage_id(whole) != internals.storage_id(whole.clone())


def test_op_overload_and_its_schema() -> None:
    """``torch._ops.OpOverload`` and ``OpOverload._schema``: aten overloads, mutable or not."""
    assert isinstance(torch.ops.aten.add_.Tensor, internals.OpOverload)
    assert not isinstance(torch.add, internals.OpOverload)
    assert internals.op_schema(torch.ops.aten.add_.Tensor).is_mutable
    assert not internals.op_schema(torch.ops.aten.add.Tensor).is_mutable
    assert [a.name for a in internals.op_schema(torch.ops.aten.add.Tensor).arguments] == ["self", "other", "alpha"]


def test_autograd_sequence_nr_follows_the_forward() -> None:
    """``autograd.graph.Node._sequence_nr()``: nodes made later in the forward number higher."""
    x = torch.ones(2, requires_grad=True)
    first = x * 2
    second = first + 1
    assert first.grad_fn is not None and second.grad_fn is not None
    assert internals.autograd_sequence_nr(second.grad_fn) > internals.autograd_sequence_nr(first.grad_fn)


def test_foreach_norms_fuse_where_clip_grad_norm_does() -> None:
    """``clip_grad._has_foreach_support`` decides, ``torch._foreach_norm`` computes: the per-tensor 2-norms."""
    tensors = [torch.arange(3.0), torch.full((2, 2), 0.5)]
    fused = torch._foreach_norm(tensors, 2.0)
    assert all(torch.equal(norm, torch.linalg.vector_norm(t, 2.0)) for norm, t in zip(fused, tensors))
    supported = torch.nn.utils.clip_grad._has_foreach_support(tensors, tensors[0].device)
    got = internals.foreach_norms(tensors)
    assert (got is not None) == supported
    if got is not None:
        assert all(torch.equal(a, b) for a, b in zip(got, fused))
    assert internals.foreach_norms([]) is None


def test_tree_leaves_and_dispatch_mode() -> None:
    """``torch.utils._pytree.tree_leaves`` and ``torch.utils._python_dispatch.TorchDispatchMode``."""
    a, b = torch.zeros(1), torch.ones(1)
    assert internals.tree_leaves({"x": [a, (b, 3)]}) == [a, b, 3]
    seen: list[Any] = []

    class Record(internals.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    with Record():
        torch.add(a, b)
    assert seen == [torch.ops.aten.add.Tensor]


def test_ignore_in_data_parallel(one_rank: None) -> None:
    """``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``: DDP leaves those names alone."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    internals.ignore_in_data_parallel(model, ["1.weight"])
    assert DistributedDataParallel(model).parameters_to_ignore == {"1.weight"}



def test_new_group_of_a_member(one_rank: None) -> None:
    """``dist.new_group`` gives a member its group; a non-member gets ``GroupMember.NON_GROUP_MEMBER``, which the
    adapter turns into None (the multi-rank runs, tests/partitioning/test_train_dp.py, take that path)."""
    group = internals.new_group([0])
    assert isinstance(group, dist.ProcessGroup) and dist.get_world_size(group) == 1
    assert isinstance(dist.GroupMember.NON_GROUP_MEMBER, int)

def test_torch_assert_calls_the_generated_code_makes() -> None:
    """``torch._assert`` and ``torch._assert_async``: the transforms write them into the generated models
    (transforms/torch_assert.py, transforms/analysis/facts.py, transforms/shift_right.py); fx records the first."""
    torch._assert(True, "fine")
    with pytest.raises(AssertionError, match="why"):
        torch._assert(False, "why")
    torch._assert_async(torch.tensor(True))
    with pytest.raises(RuntimeError):
        torch._assert_async(torch.tensor(False))

    def check(x: torch.Tensor) -> torch.Tensor:
        torch._assert(x.dim() == 1, "1-D")
        return x

    graph = torch.fx.symbolic_trace(check).graph
    assert any(node.target is torch._assert for node in graph.nodes)


# -- torch.distributed.pipelining -----------------------------------------------------------------------
def test_split_points_and_the_pipe_split_op() -> None:
    """``_IR.annotate_split_points`` splits the trace there; ``_IR.aten_pipe_split_alias`` marks it in the graph."""
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    internals.annotate_split_points(model, {"1": SplitPoint.BEGINNING})
    marked: list[torch.fx.Node] = []

    def policy(graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
        marked.extend(node for node in graph_module.graph.nodes if node.target is internals.pipe_split_op())
        return graph_module

    pipe = Pipe.from_tracing(model, (torch.ones(1, 2),), split_policy=policy)
    assert len(marked) == 1 and pipe.num_stages == 2


def test_stage_backward_weight_gives_the_weight_gradients() -> None:
    """``_backward.stage_backward_weight(weights, param_groups, retain_graph=)`` after ``stage_backward_input``."""
    torch.manual_seed(0)
    linear = nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)
    expected = torch.autograd.grad(linear(x).square().sum(), list(linear.parameters()))
    _, groups = _backward.stage_backward_input([linear(x).square().sum()], None, [x], linear.parameters())
    internals.stage_backward_weight(linear.parameters(), groups, retain_graph=False)
    assert linear.weight.grad is not None and linear.bias.grad is not None
    assert torch.equal(linear.weight.grad, expected[0]) and torch.equal(linear.bias.grad, expected[1])


def test_warmup_messages_to_this_rank_are_dropped(one_rank: None) -> None:
    """``_PipelineStageBase._get_init_p2p_neighbors_ops``: a stage whose neighbour is on its own rank (a V)."""
    first = PipelineStage(nn.Linear(2, 2), 0, 2, torch.device("cpu"))
    assert {op.peer for op in first._get_init_p2p_neighbors_ops()} == {0}
    internals.drop_warmup_messages_to(first, 0)
    assert first._get_init_p2p_neighbors_ops() == []


@pytest.mark.parametrize("schedule", [ScheduleGPipe, Schedule1F1B])
def test_a_schedule_splits_and_messages_through_the_hooks_we_wrap(one_rank: None, schedule: type) -> None:
    """``_PipelineSchedule._split_inputs`` (the timeline wraps it on the schedule object) and the module-level
    ``schedules._batch_p2p`` / ``schedules._wait_batch_p2p`` (it swaps them for the step) are what ``step`` calls."""
    events: list[str] = []
    post, wait = internals.p2p_helpers()
    assert (post, wait) == (schedules._batch_p2p, schedules._wait_batch_p2p)
    assert list(inspect.signature(post).parameters) == ["p2p_ops", "desc"]
    assert list(inspect.signature(wait).parameters) == ["work"]
    run = schedule(PipelineStage(nn.Linear(3, 2), 0, 1, torch.device("cpu")), 2, loss_fn=lambda out, target: out.sum())
    split = getattr(run, internals.SPLIT_INPUTS)

    def noted(event: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            events.append(event)
            return call(*args, **kwargs)
        return wrapper

    setattr(run, internals.SPLIT_INPUTS, noted("split", split))
    internals.set_p2p_helpers(noted("post", post), noted("wait", wait))
    try:
        losses: list[torch.Tensor] = []
        run.step(torch.ones(4, 3), target=torch.zeros(4), losses=losses)
    finally:
        internals.set_p2p_helpers(post, wait)
    assert internals.p2p_helpers() == (post, wait) and len(losses) == 2
    assert events[0] == "split" and events.count("split") == 1
    if schedule is Schedule1F1B:  # 1F1B asks for every (here empty) batch of messages; GPipe skips empty ones
        assert "post" in events and "wait" in events


# The engine's stage methods the runtime wraps or replaces by name, public in name only (documented nowhere):
# gpu/timeline.py wraps the first four, gpu/tied_stream.py backward_one_chunk, gpu/schedule_stages.py replaces
# backward_maybe_with_nosync, gpu/pipelining.py sets dw_builder.  Their parameters are what the wrappers pass on.
STAGE_METHODS = {
    "forward_one_chunk": ["self", "fwd_chunk_id", "args", "kwargs", "save_forward_output"],
    "backward_one_chunk": ["self", "bwd_chunk_id", "loss", "full_backward", "last_backward"],
    "backward_weight_one_chunk": ["self", "bwd_chunk_id", "last_backward"],
    "perform_reduce_grad": ["self", "grad_scale_factor"],
    "backward_maybe_with_nosync": ["self", "backward_type", "bwd_kwargs", "last_backward"],
}


@pytest.mark.parametrize("name", STAGE_METHODS)
def test_stage_methods_the_runtime_wraps(name: str) -> None:
    assert list(inspect.signature(getattr(stage._PipelineStageBase, name)).parameters) == STAGE_METHODS[name]


def test_dw_builder_is_a_stage_argument() -> None:
    assert "dw_builder" in inspect.signature(PipelineStage.__init__).parameters


def test_actions_as_parts() -> None:
    """``schedules._Action`` and ``_ComputationType``: an overlapped action is its ``sub_actions``, in order."""
    kinds = schedules._ComputationType
    forward = schedules._Action(1, kinds.FORWARD, 3)
    backward = schedules._Action(0, kinds.FULL_BACKWARD, 2)
    assert internals.action_parts(forward) == [(1, "F", 3)]
    both = schedules._Action(0, kinds.OVERLAP_F_B, None, (forward, backward))
    assert internals.action_parts(both) == [(1, "F", 3), (0, "B", 2)]
    assert [kinds.BACKWARD_INPUT.value, kinds.BACKWARD_WEIGHT.value] == ["I", "W"]


# -- torch.export's unflattened modules ----------------------------------------------------------------------
def test_an_unflattened_submodule_runs_its_graph_through_graph_module() -> None:
    """``InterpreterModule.graph_module``: the engine's stage modules hold unflattened submodules; a node their
    ``graph`` points elsewhere runs once ``graph_module`` is recompiled (partitioning/gpu/eval_mode.py)."""
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
    pipe = Pipe.from_tracing(model, (torch.ones(1, 2),))
    stage = pipe.get_stage_module(0)
    inner = [module for _, module in stage.named_modules() if internals.compiled_graph_module(module) is not None]
    assert inner and internals.compiled_graph_module(nn.Linear(2, 2)) is None
    owner = next(module for module in inner
                 if any(node.target is torch.ops.aten.relu.default for node in module.graph.nodes))
    compiled = internals.compiled_graph_module(owner)
    assert compiled is not None
    for node in owner.graph.nodes:
        if node.target is torch.ops.aten.relu.default:
            node.target = torch.ops.aten.neg.default
    compiled.recompile()
    x = torch.tensor([[1.0, -1.0]])
    assert torch.equal(stage(x), model[2](-model[0](x)))
