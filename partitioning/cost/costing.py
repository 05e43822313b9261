"""Cost an ordered chain of blocks by running one traced forward pass of the model.

Method.  The model is traced with ``torch.fx.symbolic_trace`` and every graph
node is given to a block by *position*: a block starts at the first node that
runs inside its first module (read from the node's ``nn_module_stack``) and
owns every node up to the next block's start.  This is where
``torch.distributed.pipelining`` cuts too (``SplitPoint.BEGINNING`` puts a
split right before that module's call), so glue code between modules (mask
building, the right shift of labels, the LM-head rescale) lands in the same
stage in both.

The graph is then interpreted once, on the model's device (``meta`` works, so
no memory is used for large shapes):

* FLOPs: one ``FlopCounterMode`` around the run; a node's FLOPs are the
  counter's growth while it runs.  This is the forward count only: backward
  is modelled as 2x forward by the partitioner, because the counter's
  per-module backward attribution is wrong.
* Crossing tensors: a value produced in block ``p`` and last used in block
  ``u > p`` is live across every cut ``p .. u-1``; a cut's bytes are the sum
  over those values (model inputs count as produced in block 0, so labels and
  decoder ids passed through are included).  Parameters and constants
  (``get_attr``) never cross: a pipeline replicates them.  Each crossing
  value also says whether and at what cost a receiving stage could
  recompute it (:mod:`partitioning.cost.crossing`): the run records, per node,
  its FLOPs, the bytes it writes, whether it draws random numbers and which
  tensors it writes in place.
* Activations saved for backward: a ``saved_tensors_hooks`` pack hook sees
  every tensor autograd keeps.  A view is counted as its base, parameters are
  skipped (they are parameter bytes), and a tensor is counted once per block
  that saves it: exact for a block alone on a stage, an upper bound when two
  blocks of one stage save the same tensor (e.g. the encoder output that every
  decoder block's cross-attention keeps).
* Time (optional, real devices only): a second run timestamps each block
  transition; the median over repeats is kept.  The clock is wall time, or
  the thread's CPU time when asked (a single-threaded CPU run on a shared
  machine: time the thread waited for a core is not the block's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import GraphModule, Node

from common.errors import UserError
from partitioning.cost.crossing import crossing_values
from partitioning.cost.graph_run import CostingInterpreter, measure
from partitioning.plan import Block, Value


@dataclass(frozen=True)
class BlockSpec:
    """A block before costing: its name and the modules it runs (the first starts it)."""

    name: str
    modules: tuple[str, ...]


@dataclass
class Chain:
    """Costed blocks plus what the baselines and backends need beside them."""

    blocks: list[Block]
    shared_bytes: dict[str, int] = field(default_factory=dict)  # shared weight name -> bytes
    total_flops: int = 0  # the whole forward as FlopCounterMode counts it
    values: list[Value] = field(default_factory=list)  # every tensor crossing a cut, recomputable or not


def _module_paths(node: Node) -> set[str]:
    paths = {path for path, _ in (node.meta.get("nn_module_stack") or {}).values()}
    if node.op == "call_module":
        paths.add(str(node.target))
    return paths


def assign_blocks(model: torch.nn.Module, graph_module: GraphModule, specs: Sequence[BlockSpec]) -> dict[Node, int]:
    """The block index of every node, cutting before each block's first module call."""
    # The tracer names a module by the first of its aliases (T5's ``shared`` is also
    # ``encoder.embed_tokens``), so starts are matched by module identity, in order.
    names_of: dict[int, set[str]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        names_of.setdefault(id(module), set()).add(name)
    starts = []
    for spec in specs:
        try:
            starts.append(names_of[id(model.get_submodule(spec.modules[0]))])
        except AttributeError:
            raise UserError(f"block {spec.name!r}: the model has no module {spec.modules[0]!r}") from None
    current, block_of, first_runs = 0, {}, False
    for node in graph_module.graph.nodes:
        if current + 1 < len(specs) and starts[current + 1] & _module_paths(node):
            current += 1
        block_of[node] = current
        first_runs = first_runs or (current == 0 and bool(starts[0] & _module_paths(node)))
    if not first_runs:
        raise UserError(f"block {specs[0].name!r}: module {specs[0].modules[0]!r} does not run before the next block")
    if current != len(specs) - 1:
        missing = specs[current + 1]
        raise UserError(f"block {missing.name!r}: module {missing.modules[0]!r} never runs after block "
                        f"{specs[current].name!r}")
    return block_of


def _parameter_use(model: torch.nn.Module, graph_module: GraphModule,
                   block_of: dict[Node, int]) -> tuple[dict[str, set[int]], dict[str, int]]:
    """For each parameter (by canonical name): the blocks that use it, and its bytes."""
    canonical = {id(p): name for name, p in model.named_parameters()}
    users: dict[str, set[int]] = {}
    sizes = {name: p.numel() * p.element_size() for name, p in model.named_parameters()}
    for node in graph_module.graph.nodes:
        if node.op == "call_module":
            for p in graph_module.get_submodule(str(node.target)).parameters():
                users.setdefault(canonical[id(p)], set()).add(block_of[node])
        elif node.op == "get_attr":
            value = graph_module
            for part in str(node.target).split("."):
                value = getattr(value, part)
            if isinstance(value, torch.nn.Parameter) and id(value) in canonical:
                blocks = {block_of[user] for user in node.users} or {block_of[node]}
                users.setdefault(canonical[id(value)], set()).update(blocks)
    return users, sizes


def _inputs_in_order(graph_module: GraphModule, kwargs: dict[str, Any]) -> list[Any]:
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    names = {n.target for n in placeholders}
    unknown = set(kwargs) - names
    if unknown:
        raise UserError(f"the traced model takes no input named {sorted(unknown)[0]!r}")
    return [kwargs.get(str(n.target)) for n in placeholders]


def cost_chain(model: torch.nn.Module, specs: Sequence[BlockSpec], kwargs: dict[str, torch.Tensor],
               concrete_args: dict[str, Any], measure_repeats: int = 0,
               clock: Callable[[], float] = time.perf_counter) -> Chain:
    """Cost every block of ``specs`` for one micro-batch given as ``kwargs``."""
    if not specs:
        raise UserError("the chain has no blocks")
    graph_module = torch.fx.symbolic_trace(model, concrete_args=concrete_args)
    block_of = assign_blocks(model, graph_module, specs)
    args = _inputs_in_order(graph_module, kwargs)
    costing = CostingInterpreter(graph_module, block_of, len(specs))
    costing.cost(*args)

    crossing: list[list[Node]] = [[] for _ in specs]
    for node, size in costing.value_bytes.items():
        if not size or not node.users:
            continue
        last_use = max(block_of[user] for user in node.users)
        for cut in range(block_of[node], last_use):
            crossing[cut].append(node)

    users, sizes = _parameter_use(model, graph_module, block_of)
    param_bytes = [0] * len(specs)
    shared: list[list[str]] = [[] for _ in specs]
    shared_bytes: dict[str, int] = {}
    for name, using in users.items():
        param_bytes[min(using)] += sizes[name]
        if len(using) > 1:
            shared_bytes[name] = sizes[name]
            for block in sorted(using):
                shared[block].append(name)

    seconds: list[float | None] = [None] * len(specs)
    if measure_repeats:
        seconds = list(measure(graph_module, block_of, len(specs), args, measure_repeats, clock))

    blocks = [Block(name=spec.name, modules=spec.modules, flops=float(costing.flops[i]), param_bytes=param_bytes[i],
                    out_bytes=sum(costing.value_bytes[n] for n in crossing[i]),
                    activation_bytes=sum(costing.saved[i].values()), seconds=seconds[i], shared=tuple(shared[i]),
                    crossing=tuple(costing.descriptions[n] for n in crossing[i]))
              for i, spec in enumerate(specs)]
    costing.nodes.bytes = costing.value_bytes
    values = crossing_values(model, graph_module, block_of, costing.nodes, costing.facts())
    return Chain(blocks=blocks, shared_bytes=shared_bytes, total_flops=sum(costing.flops), values=values)
