"""Backward slices of a traced value: the nodes that compute it from parameters and model inputs.

A value crossing a pipeline cut can be recomputed by the receiving stage
instead of received when the nodes computing it (its *slice*) can be
replayed there: they read only parameters, buffers, constants and model
inputs (the *leaves*), draw no random numbers, and no write aliases across
the slice's boundary (a slice node writing a leaf, or a node outside it
writing a tensor the slice made or read).  Replaying such a slice on the
same inputs gives the same bits.

Both graphs this project traces use it: the costing graph (torch.fx, facts
about random draws and writes recorded while it runs, see
:mod:`partitioning.cost.costing`) and the pipelining backend's ``torch.export``
graph (facts read off the aten operator schemas, :func:`aten_facts`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.fx import Graph, Node

from stateless.torch_internals import OpOverload, op_schema


@dataclass
class OpFacts:
    """What running each node does beyond computing its output."""

    random: set[Node] = field(default_factory=set)  # draws random numbers (dropout, ...)
    writes: dict[Node, set[Node]] = field(default_factory=dict)  # node -> nodes whose tensors it writes in place


@dataclass(frozen=True)
class Slice:
    """The nodes computing a value, in graph order, and where they start from."""

    nodes: tuple[Node, ...]
    leaves: tuple[Node, ...]  # placeholders / model-input copies, get_attr (parameters, buffers, constants)
    replayable: bool  # deterministic and closed under writes
    reason: str = ""  # why not, when it is not


def backward_slice(value: Node, is_leaf: Callable[[Node], bool], facts: OpFacts) -> Slice:
    """The slice of ``value``: every node it depends on down to the leaves (``value`` itself included)."""
    inside: set[Node] = set()
    leaves: set[Node] = set()
    pending = [value]
    while pending:
        node = pending.pop()
        if node in inside or node in leaves:
            continue
        if node is not value and is_leaf(node):
            leaves.add(node)
            continue
        if node.op == "placeholder":
            return Slice((), (), False, f"{value.name} reads {node.name}, which no later stage can hold")
        if node in facts.random:
            return Slice((), (), False, f"{value.name} depends on a random draw ({node.name})")
        inside.add(node)
        pending.extend(node.all_input_nodes)
    order = {node: index for index, node in enumerate(value.graph.nodes)}
    nodes = tuple(sorted(inside, key=order.__getitem__))
    reason = _write_conflict(inside, leaves, facts)
    return Slice(nodes, tuple(sorted(leaves, key=order.__getitem__)), not reason, reason)


def _write_conflict(inside: set[Node], leaves: set[Node], facts: OpFacts) -> str:
    for writer, written in facts.writes.items():
        for target in written:
            if writer in inside and target not in inside:
                return f"{writer.name} writes {target.name}, which the slice does not compute"
            if writer not in inside and (target in inside or target in leaves):
                return f"{writer.name} writes {target.name}, which the slice reads"
    return ""


def aten_facts(graph: Graph) -> OpFacts:
    """Random draws and in-place writes of an aten-level graph, from the operator schemas.

    A write through a view lands on the view's base: aliases are followed
    back through every operator whose schema says its output aliases an input.
    """
    facts = OpFacts()
    base: dict[Node, Node] = {}

    def root(node: Node) -> Node:
        while node in base:
            node = base[node]
        return node

    for node in graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, OpOverload):
            continue
        if torch.Tag.nondeterministic_seeded in target.tags:
            facts.random.add(node)
        schema = op_schema(target)
        arguments = list(node.args) + [node.kwargs.get(a.name) for a in schema.arguments[len(node.args):]]
        aliased = {alias for ret in schema.returns if ret.alias_info is not None for alias in ret.alias_info.before_set}
        for spec, arg in zip(schema.arguments, arguments):
            if not isinstance(arg, Node) or spec.alias_info is None:
                continue
            if spec.alias_info.is_write:
                facts.writes.setdefault(node, set()).add(root(arg))
            if aliased & set(spec.alias_info.before_set) and node not in base:
                base[node] = arg
    return facts
