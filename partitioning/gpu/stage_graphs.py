"""Rewrites of the engine's split graph that ``torch.distributed.pipelining`` needs for models such as T5 to run.

All of them change only how values travel between stages, never what a
stage computes.  Every rank rewrites the whole split graph the same way, so
all ranks agree on who sends what to whom; each then fixes the boundaries
of its own stage.
"""

from __future__ import annotations

import operator

import torch


def _contiguous(value: torch.Tensor) -> torch.Tensor:
    """A stand-in for a traced value with its shape and dtype but contiguous strides."""
    return torch.empty(value.shape, dtype=value.dtype, device="meta")


def contiguous_boundaries(stage_module: torch.fx.GraphModule) -> None:
    """Make a stage send contiguous tensors and expect contiguous ones.

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
                node = graph.call_method("contiguous", (value,))
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


def relay_shared_activations(split_gm: torch.fx.GraphModule) -> None:
    """Send a value needed by several stages to the first of them only, which passes it on.

    The engine supports a stage output going to one later stage (even a
    non-adjacent one) but not to several when it needs a gradient ("Backward
    of skip connections not supported yet"); T5's encoder output feeds every
    decoder stage.  Each consumer but the last returns its input unchanged as
    an extra output for the next consumer, and backward sums the gradients
    along the same chain.
    """
    graph = split_gm.graph
    stages = [node for node in graph.nodes if node.op == "call_module"]
    order = {node: index for index, node in enumerate(stages)}
    for producer in stages:
        values = [user for user in producer.users if user.target is operator.getitem] or [producer]
        for value in values:
            consumers = sorted({user for user in value.users if user in order}, key=order.__getitem__)
            original = value  # what every later consumer still reads until its turn comes
            for previous, following in zip(consumers, consumers[1:]):
                module = _stage(split_gm, previous)
                placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
                passed = placeholders[previous.args.index(value)]
                outputs = _tuple_output(split_gm, previous)
                output = next(node for node in module.graph.nodes if node.op == "output")
                output.args = ((*outputs, passed),)
                module.recompile()
                with graph.inserting_after(previous):
                    relayed = graph.call_function(operator.getitem, (previous, len(outputs)))
                relayed.meta = dict(value.meta)
                following.replace_input_with(original, relayed)
                value = relayed
    split_gm.recompile()


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
