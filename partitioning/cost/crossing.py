"""The tensors crossing the cuts of a costed chain, and what recomputing each would take.

Every value produced in one block and read in a later one becomes a
:class:`~partitioning.plan.Value`: its bytes, where it is made and read, the
key a backend finds it by in its own trace, and, when its slice
(:mod:`partitioning.cost.slices`) can be replayed by a receiving stage, the cost
of doing so (:class:`~partitioning.plan.Recompute`: FLOPs and written bytes of
the slice, the parameters and model inputs it reads, whether the value
carries a gradient).  Model inputs are never recomputed: they are carried.
Nothing here is specific to a model: T5's relative position bias and its
extended attention masks qualify because of what their slices contain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch.fx import GraphModule, Node

from partitioning.cost.slices import OpFacts, backward_slice
from partitioning.plan import Recompute, Value, value_key


@dataclass
class NodeCosts:
    """What the costing run measured of each node."""

    flops: dict[Node, int] = field(default_factory=dict)
    written: dict[Node, int] = field(default_factory=dict)  # bytes of tensors on storage it allocated
    bytes: dict[Node, int] = field(default_factory=dict)  # bytes of its output tensors
    grad: dict[Node, bool] = field(default_factory=dict)  # an output requires a gradient
    tensors: dict[Node, list[tuple[str, tuple[int, ...]]]] = field(default_factory=dict)  # (dtype, shape) each


def producing_module(node: Node) -> str:
    """The innermost module running ``node`` (a leaf module's own call included)."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]) if stack else ""


def _leaves(costs: NodeCosts) -> Callable[[Node], bool]:
    """Slices start at parameters, constants and model inputs, and at values holding no tensor.

    Those are shapes, sizes and devices read off tensors (``hidden_states.shape[1]``): fixed
    by the traced micro-batch, as the pipeline's stage graphs are.
    """
    def is_leaf(node: Node) -> bool:
        return node.op in ("placeholder", "get_attr") or not costs.tensors.get(node)
    return is_leaf


def _parameters(model: torch.nn.Module, graph_module: GraphModule, nodes: Sequence[Node],
                leaves: Sequence[Node]) -> tuple[list[str], int, bool]:
    """Parameters and buffers a slice reads (canonical names), their bytes, and whether any trains."""
    canonical = {id(t): name for name, t in [*model.named_parameters(), *model.named_buffers()]}
    found: dict[str, torch.Tensor] = {}
    for node in [*nodes, *leaves]:
        if node.op == "call_module":
            module = graph_module.get_submodule(str(node.target))
            tensors = [*module.parameters(), *module.buffers()]
        elif node.op == "get_attr":
            value = graph_module
            for part in str(node.target).split("."):
                value = getattr(value, part)
            tensors = [value] if isinstance(value, torch.Tensor) else []
        else:
            continue
        for tensor in tensors:
            if id(tensor) in canonical:
                found[canonical[id(tensor)]] = tensor
    names = sorted(found)
    size = sum(t.numel() * t.element_size() for t in found.values())
    trains = any(isinstance(t, torch.nn.Parameter) and t.requires_grad for t in found.values())
    return names, size, trains


def _recompute(model: torch.nn.Module, graph_module: GraphModule, node: Node, costs: NodeCosts,
               facts: OpFacts) -> Recompute | None:
    if len(costs.tensors.get(node, ())) != 1:
        return None  # a backend finds and replays single tensors
    found = backward_slice(node, _leaves(costs), facts)
    if not found.replayable:
        return None
    params, param_bytes, trains = _parameters(model, graph_module, found.nodes, found.leaves)
    inputs = tuple((str(leaf.target), costs.bytes[leaf]) for leaf in found.leaves
                   if leaf.op == "placeholder" and costs.bytes.get(leaf))
    return Recompute(flops=float(sum(costs.flops.get(n, 0) for n in found.nodes)),
                     bytes=sum(costs.written.get(n, 0) for n in found.nodes), params=tuple(params),
                     param_bytes=param_bytes, inputs=inputs, grad=costs.grad.get(node, False) and trains)


def crossing_values(model: torch.nn.Module, graph_module: GraphModule, block_of: dict[Node, int],
                    costs: NodeCosts, facts: OpFacts) -> list[Value]:
    """Every tensor live across a cut, in graph order."""
    values = []
    for node in graph_module.graph.nodes:
        size = costs.bytes.get(node, 0)
        uses = sorted({block_of[user] for user in node.users})
        if not size or not uses or uses[-1] <= block_of[node]:
            continue
        dtype, shape = costs.tensors[node][0]
        is_input = node.op == "placeholder"
        key = f"input:{node.target}" if is_input else value_key(producing_module(node), dtype, shape)
        recompute = None if is_input else _recompute(model, graph_module, node, costs, facts)
        values.append(Value(name=node.name, key=key, bytes=size, produced=block_of[node], uses=tuple(uses),
                            recompute=recompute, input=is_input))
    return values
