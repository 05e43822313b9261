"""Rewrites of the engine's split graph that ``torch.distributed.pipelining`` needs for models such as T5 to run.

All of them change only how values travel between stages, never what a
stage computes.  Every rank rewrites the whole split graph the same way, so
all ranks agree on who sends what to whom; each then fixes the boundaries
of its own stage.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch


def _contiguous(value: torch.Tensor) -> torch.Tensor:
    """A stand-in for a traced value with its shape and dtype but contiguous strides."""
    return torch.empty(value.shape, dtype=value.dtype, device="meta")


def contiguous_boundaries(stage_module: torch.fx.GraphModule, copy: bool = False) -> None:
    """Make a stage send contiguous tensors and expect contiguous ones.

    ``copy``: send fresh copies, never views: the engine's input-gradient
    step (zero-bubble schedules) detaches a stage's outputs in place, which
    a view refuses.  A copy is exact, so gradients do not change.

    The engine sizes its receive buffers (activations on the receiving stage,
    gradients on the sending one) with the strides recorded at trace time, so
    the recorded values change along with the graph.
    """
    graph = stage_module.graph
    output = next(node for node in graph.nodes if node.op == "output")
    for node in graph.nodes:
        if node.op == "placeholder" and isinstance(node.meta.get("val"), torch.Tensor):
            node.meta["val"] = _contiguous(node.meta["val"])

    def make_contiguous(value: object) -> object:
        if isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), torch.Tensor):
            with graph.inserting_before(output):
                node = graph.call_function(torch.clone, (value,), {"memory_format": torch.contiguous_format}) \
                    if copy else graph.call_method("contiguous", (value,))
            node.meta = {**value.meta, "val": _contiguous(value.meta["val"])}
            return node
        if isinstance(value, (tuple, list)):
            return type(value)(make_contiguous(v) for v in value)
        return value

    output.args = tuple(make_contiguous(arg) for arg in output.args)
    stage_module.recompile()


def _stage(split_gm: torch.fx.GraphModule, stage_node: torch.fx.Node) -> torch.fx.GraphModule:
    """The stage a ``call_module`` node of the split graph runs (split_module makes each one a GraphModule)."""
    module = split_gm.get_submodule(str(stage_node.target))
    assert isinstance(module, torch.fx.GraphModule), stage_node.target
    return module


def _tuple_output(split_gm: torch.fx.GraphModule, stage_node: torch.fx.Node) -> list[object]:
    """The stage's outputs as a list, turning a single output into a 1-tuple (root users read item 0)."""
    stage_module = _stage(split_gm, stage_node)
    output = next(node for node in stage_module.graph.nodes if node.op == "output")
    if isinstance(output.args[0], (tuple, list)):
        return list(output.args[0])
    output.args = ((output.args[0],),)
    users = list(stage_node.users)
    with split_gm.graph.inserting_after(stage_node):
        first = split_gm.graph.call_function(operator.getitem, (stage_node, 0))
    first.meta = dict(stage_node.meta)
    for user in users:
        user.replace_input_with(stage_node, first)
    return [output.args[0][0]]


def relay_along_chain(split_gm: torch.fx.GraphModule) -> None:
    """Make every stage read only what the stage before it sends: a value skipping stages is passed along.

    Two engine limits meet here.  A stage output going to several later
    stages cannot carry a gradient back ("Backward of skip connections not
    supported yet"; T5's encoder output feeds every decoder stage).  And the
    multi-stage schedules (interleaved, looped, zero bubble, V-shaped) only
    talk between neighbours: their runtime posts one stream of messages per
    pair of adjacent stages, hands a same-rank neighbour its outputs
    positionally, and says it "does not support models with skip
    connections".  So every stage between a value's producer and its last
    consumer returns the value unchanged as an extra output (the input it
    already reads, or a new input), and later stages read that relay.  In
    backward the gradients come down the same chain; a relaying stage that
    also uses the value adds its own use's gradient first, as a stage that
    consumed and sent it on always did.  Nothing a stage computes changes.
    """
    graph = split_gm.graph
    stages = [node for node in graph.nodes if node.op == "call_module"]
    order = {node: index for index, node in enumerate(stages)}
    for producer in stages:
        values = [user for user in producer.users if user.target is operator.getitem] or [producer]
        for value in values:
            consumers = [user for user in value.users if user in order]
            if not consumers:
                continue
            last = max(order[user] for user in consumers)
            for between in stages[order[producer] + 1:last]:
                value = _relay(split_gm, between, value, [s for s in stages if order[s] > order[between]])
    split_gm.recompile()


def _traced_value(split_gm: torch.fx.GraphModule, value: torch.fx.Node) -> object:
    """The traced value (``meta["val"]``) of a stage's output: the producing stage's graph records it."""
    getitem = value.target is operator.getitem
    stage: Any = value.args[0] if getitem else value
    module: Any = split_gm.get_submodule(str(stage.target))
    output: Any = next(node for node in module.graph.nodes if node.op == "output").args[0]
    return (output[value.args[1]] if getitem else output).meta["val"]


def _relay(split_gm: torch.fx.GraphModule, stage: torch.fx.Node, value: torch.fx.Node,
           later: list[torch.fx.Node]) -> torch.fx.Node:
    """``stage`` returns ``value`` (read as an input, added if it was not) to ``later`` stages: the relayed node."""
    module: Any = split_gm.get_submodule(str(stage.target))
    placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
    if value in stage.args:
        passed = placeholders[stage.args.index(value)]
    else:
        with module.graph.inserting_after(placeholders[-1]) if placeholders else \
                module.graph.inserting_before(next(iter(module.graph.nodes))):
            passed = module.graph.placeholder(f"relayed_{value.name}")
        passed.meta = {"val": _traced_value(split_gm, value)}
        stage.args = (*stage.args, value)
    outputs = _tuple_output(split_gm, stage)
    output = next(node for node in module.graph.nodes if node.op == "output")
    output.args = ((*outputs, passed),)
    module.recompile()
    with split_gm.graph.inserting_after(stage):
        relayed = split_gm.graph.call_function(operator.getitem, (stage, len(outputs)))
    relayed.meta = dict(value.meta)
    for user in later:
        user.replace_input_with(value, relayed)
    return relayed


def sort_stage_inputs(split_gm: torch.fx.GraphModule) -> None:
    """Order each stage's inputs by (sending stage, output index).

    Messages between two ranks are matched in the order they are posted: the
    sender posts in its output order, the receiver in its input order, so
    the two must agree once relaying has added inputs.
    """
    stages = [node for node in split_gm.graph.nodes if node.op == "call_module"]
    order = {node: index for index, node in enumerate(stages)}

    def source(arg: object) -> tuple[int, int]:
        if isinstance(arg, torch.fx.Node) and arg.target is operator.getitem and arg.args[0] in order:
            index = arg.args[1]
            assert isinstance(index, int), arg  # getitem on a stage's output tuple: a constant position
            return order[arg.args[0]], index
        if isinstance(arg, torch.fx.Node) and arg in order:
            return order[arg], 0
        return -1, 0  # a model input: stage 0 only

    for stage in stages:
        permutation = sorted(range(len(stage.args)), key=lambda i: source(stage.args[i]))
        if permutation == list(range(len(stage.args))):
            continue
        module = _stage(split_gm, stage)
        placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
        anchor = next(node for node in module.graph.nodes if node.op != "placeholder")
        for index in permutation:
            anchor.prepend(placeholders[index])
        module.recompile()
        stage.args = tuple(stage.args[index] for index in permutation)
    split_gm.recompile()


def retarget_devices(stage_module: torch.nn.Module, device: torch.device) -> None:
    """Give the device arguments a trace on ``meta`` recorded (``torch.arange(n, device=x.device)`` of a mask, a
    ``.to(x.device)``) the run's ``device``: else the stage would make those tensors on ``meta`` and combine them
    with its inputs.  Every graph of the stage is rewritten (unflattened submodules are interpreted from theirs)."""
    def retarget(value: Any) -> Any:
        return device if isinstance(value, torch.device) and value.type == "meta" else value

    for module in stage_module.modules():
        graph = getattr(module, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        for node in graph.nodes:
            node.args = torch.fx.node.map_aggregate(node.args, retarget)
            node.kwargs = torch.fx.node.map_aggregate(node.kwargs, retarget)
        if isinstance(module, torch.fx.GraphModule):
            module.recompile()


@dataclass(frozen=True)
class Route:
    """Where a stage's inputs come from and what it sends: ``sources`` per input ``(-1, i)`` (the model's input
    ``i``) or ``(stage, k)`` (that stage's output ``k``); ``outputs`` the shape and dtype of each output."""

    sources: tuple[tuple[int, int], ...]
    outputs: tuple[tuple[torch.Size, torch.dtype], ...]


def stage_routes(split_gm: torch.fx.GraphModule) -> list[Route]:
    """Every stage's :class:`Route`, read off the split graph after :func:`relay_along_chain` and
    :func:`sort_stage_inputs` (so a stage after the first reads only its predecessor's outputs)."""
    inputs = {node: index for index, node in enumerate(n for n in split_gm.graph.nodes if n.op == "placeholder")}
    stages = [node for node in split_gm.graph.nodes if node.op == "call_module"]
    order = {node: index for index, node in enumerate(stages)}
    routes = []
    for index, stage in enumerate(stages):
        sources = []
        for arg in stage.args:
            if isinstance(arg, torch.fx.Node) and arg in inputs:
                sources.append((-1, inputs[arg]))
            elif isinstance(arg, torch.fx.Node) and arg.target is operator.getitem and arg.args[0] in order:
                sources.append((order[arg.args[0]], int(arg.args[1])))  # type: ignore[arg-type]
            elif isinstance(arg, torch.fx.Node) and arg in order:
                sources.append((order[arg], 0))
            else:
                raise AssertionError(f"stage {index} reads {arg!r}, neither a model input nor a stage's output")
        if index and any(source != index - 1 for source, _ in sources):
            raise AssertionError(f"stage {index} reads {sources}: not only its predecessor's outputs (relay first)")
        output = next(node for node in _stage(split_gm, stage).graph.nodes if node.op == "output").args[0]
        values = output if isinstance(output, (tuple, list)) else (output,)
        routes.append(Route(tuple(sources), tuple((value.meta["val"].shape, value.meta["val"].dtype)
                                                  for value in values)))
    return routes
