"""The pipelining backend's half of recompute-instead-of-send: replay a value's slice in the receiving stage.

It runs on the flat ``torch.export`` graph the engine is about to split
(``Pipe.from_tracing``'s ``split_policy`` hook), where ``pipe_split`` markers
already separate the stages.  For every stage and every value the plan says
that stage recomputes (found by :func:`~partitioning.plan.value_key`, the key
the costing recorded), the value's slice (:mod:`partitioning.cost.slices`) is
copied to the start of the stage and the stage's reads of the value are
pointed at the copy.  The engine then splits as usual: the slice's
parameters become replicas in the stage (synchronised like tied weights by
:mod:`partitioning.gpu.tied`), the model inputs it reads travel as small stage
inputs, and the value itself no longer crosses.

A value that carries a gradient is replayed outside autograd and its
gradient returned to the previous holder (:mod:`partitioning.gpu.gradient_return`),
so gradients stay bit-equal to single-process training.  Nothing here knows a
model: values are found by key, slices by graph structure.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.fx import Graph, GraphModule, Node

from common.errors import UserError
from partitioning.cost.slices import aten_facts, backward_slice
from partitioning.gpu.gradient_return import GradientLink
from partitioning.plan import Plan, value_key
from stateless.torch_internals import OpOverload, op_schema, pipe_split_op


@dataclass
class Recomputation:
    """What the rewrite did: per stage the values it replays, and the gradient links it made."""

    replayed: dict[int, list[str]] = field(default_factory=dict)  # stage -> keys
    links: list[GradientLink] = field(default_factory=list)


def _module(node: Node, prefix: str) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path = str(list(stack.values())[-1][0]) if stack else ""
    return "" if path == prefix.rstrip(".") else path.removeprefix(prefix)


def _key(node: Node, prefix: str) -> str | None:
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return None
    return value_key(_module(node, prefix), str(value.dtype).removeprefix("torch."), tuple(value.shape))


def _stages(graph: Graph) -> tuple[dict[Node, int], list[Node]]:
    """Each node's stage (the pipe_split markers before it) and the markers themselves."""
    stage, stage_of, splits = 0, {}, []
    for node in graph.nodes:
        if node.op == "call_function" and node.target is pipe_split_op():
            stage += 1
            splits.append(node)
        stage_of[node] = stage
    return stage_of, splits


def _trainable(graph_module: GraphModule, graph: Graph) -> set[Node]:
    """Nodes whose value depends on a trainable parameter through floating-point values."""
    found: set[Node] = set()
    for node in graph.nodes:
        if node.op == "get_attr":
            value = graph_module
            for part in str(node.target).split("."):
                value = getattr(value, part)
            if isinstance(value, torch.nn.Parameter) and value.requires_grad:
                found.add(node)
        elif node.op == "call_function" and any(source in found for source in node.all_input_nodes):
            values = node.meta.get("val")
            leaves = values if isinstance(values, (tuple, list)) else [values]
            if any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in leaves):
                found.add(node)
    return found


def _is_leaf(node: Node) -> bool:
    """Slices start at parameters and constants, at the carried copies of model inputs, and at non-tensors."""
    return (node.op == "get_attr" or any(source.op == "placeholder" for source in node.all_input_nodes)
            or (node.op != "placeholder" and not isinstance(node.meta.get("val"), torch.Tensor)))


def _scope(split: Node) -> dict:
    """The module scope a stage starts in: that of the module whose call the split marker precedes."""
    stack = dict(split.meta.get("nn_module_stack") or {})
    if stack:
        stack.pop(list(stack)[-1])
    return stack


def recompute_in_stages(graph_module: GraphModule, plan: Plan, prefix: str) -> Recomputation:
    """Rewrite ``graph_module`` (flat, with pipe_split markers) so each stage replays what the plan says."""
    graph = graph_module.graph
    stage_of, splits = _stages(graph)
    if len(splits) != len(plan.stages) - 1:
        raise UserError(f"the traced model has {len(splits) + 1} stages, the plan {len(plan.stages)}")
    facts, trainable = aten_facts(graph), _trainable(graph_module, graph)
    done = Recomputation()
    holders: dict[Node, list[tuple[int, Node]]] = {}  # value -> (stage, node holding it there), in stage order
    for stage in plan.stages[1:]:
        wanted = set(stage.recompute)
        if not wanted:
            continue
        t = stage.index
        stage_of, _ = _stages(graph)
        crossing = [node for node in graph.nodes if 0 <= stage_of[node] < t and node.op == "call_function"
                    and any(stage_of[user] == t for user in node.users)]
        chosen = [node for node in crossing if _key(node, prefix) in wanted]
        missing = wanted - {_key(node, prefix) for node in chosen}
        if missing:
            raise UserError(f"stage {t} should recompute {sorted(missing)[0]}, but the traced model sends it no "
                            f"such value: re-plan with partition-model")
        anchor, copies = splits[t - 1], []
        for value in chosen:
            found = backward_slice(value, _is_leaf, facts)
            if not found.replayable:
                raise UserError(f"stage {t} cannot recompute {_key(value, prefix)}: {found.reason}")
            anchor, copy = _replay(graph, found.nodes, anchor, _scope(splits[t - 1]))
            for user in [u for u in value.users if stage_of[u] == t]:
                user.replace_input_with(value, copy)
            copies.append((value, copy))
            holders.setdefault(value, [(stage_of[value], value)])
        done.replayed[t] = sorted({_key(value, prefix) for value in chosen})  # type: ignore[misc]
        graded = [(value, copy) for value, copy in copies if value in trainable]
        held = dict(copies)
        if graded:
            held.update(_return_gradients(graph, graded, holders, t, anchor, splits, stage_of, trainable, done))
        for value in chosen:
            holders[value].append((t, held[value]))
        _drop_unused(graph, chosen)
    graph.lint()
    graph_module.recompile()
    return done


def _drop_unused(graph: Graph, nodes: list[Node]) -> None:
    """Remove what no stage reads any more (a value made only for stages that now replay it)."""
    pending = list(nodes)
    while pending:
        node = pending.pop()
        pure = (node.op == "call_function" and isinstance(node.target, OpOverload)
                and not op_schema(node.target).is_mutable and torch.Tag.nondeterministic_seeded not in node.target.tags)
        if pure and not node.users:
            sources = node.all_input_nodes
            graph.erase_node(node)
            pending.extend(sources)


def _replay(graph: Graph, nodes: tuple[Node, ...], anchor: Node, scope: dict) -> tuple[Node, Node]:
    """Copy ``nodes`` (a slice, in order) after ``anchor``; the new anchor and the copy of the last one."""
    env: dict[Node, Node] = {}
    for node in nodes:
        with graph.inserting_after(anchor):
            copy = graph.node_copy(node, lambda source: env.get(source, source))
        copy.meta = {**node.meta, "nn_module_stack": scope}
        env[node] = anchor = copy
    return anchor, env[nodes[-1]]


def _return_gradients(graph: Graph, graded: list[tuple[Node, Node]], holders: dict[Node, list[tuple[int, Node]]],
                      t: int, anchor: Node, splits: list[Node], stage_of: dict[Node, int], trainable: set[Node],
                      done: Recomputation) -> dict[Node, Node]:
    """Make stage ``t``'s replayed values leaves whose gradients return to their previous holders.

    Returns, per value, the leaf stage ``t``'s reads now use.
    """
    used: dict[Node, Node] = {}
    by_holder: dict[int, list[tuple[Node, Node]]] = {}
    for value, copy in graded:
        by_holder.setdefault(holders[value][-1][0], []).append((value, copy))
    for receiver, pairs in sorted(by_holder.items()):
        link = GradientLink(sender=t, receiver=receiver, count=len(pairs))
        done.links.append(link)
        scope = _scope(splits[t - 1])
        with graph.inserting_after(anchor):
            leaves = graph.call_function(link.recomputed, tuple(copy for _, copy in pairs))
        leaves.meta = {"nn_module_stack": scope, "val": tuple(copy.meta["val"] for _, copy in pairs)}
        anchor = leaves
        for index, (_, copy) in enumerate(pairs):
            with graph.inserting_after(anchor):
                leaf = graph.call_function(operator.getitem, (leaves, index))
            leaf.meta = {"nn_module_stack": scope, "val": copy.meta["val"]}
            anchor = leaf
            for user in [u for u in copy.users if u is not leaves]:
                user.replace_input_with(copy, leaf)
            trainable.add(leaf)
            used[pairs[index][0]] = leaf
        _inject(graph, link, [dict(holders[v])[receiver] for v, _ in pairs], receiver, splits, stage_of, trainable)
    return used


def _inject(graph: Graph, link: GradientLink, values: list[Node], holder: int, splits: list[Node],
            stage_of: dict[Node, int], trainable: set[Node]) -> None:
    """End ``holder``'s forward with the link's inject node on a differentiable value it sends on."""
    end = splits[holder]  # the marker starting the next stage
    carriers = [node for node in graph.nodes if stage_of.get(node) == holder and node in trainable
                and node.op == "call_function" and isinstance(node.meta.get("val"), torch.Tensor)
                and any(stage_of.get(user, -1) > holder for user in node.users)]
    if not carriers:
        raise UserError(f"stage {holder} sends no value with a gradient that could carry the gradients "
                        f"of the values stage {link.sender} recomputes")
    carrier = max(carriers, key=lambda node: node.meta["val"].numel())
    with graph.inserting_before(end):
        injected = graph.call_function(link.inject, (carrier, *values))
    injected.meta = {**carrier.meta, "nn_module_stack": _scope(end)}
    for user in [u for u in carrier.users if u is not injected and stage_of.get(u, -1) > holder]:
        user.replace_input_with(carrier, injected)
    stage_of[injected] = holder
    trainable.add(injected)


def recompute_policy(plan: Plan, prefix: str, done: Recomputation) -> Callable[[GraphModule], GraphModule]:
    """A ``split_policy`` for ``Pipe.from_tracing`` that rewrites the graph and leaves the split to the engine."""
    def policy(graph_module: GraphModule) -> GraphModule:
        result = recompute_in_stages(graph_module, plan, prefix)
        done.replayed.update(result.replayed)
        done.links.extend(result.links)
        return graph_module
    return policy
