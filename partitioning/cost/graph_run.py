"""The runs of the traced graph that :mod:`partitioning.cost.costing` makes, block by block.

:class:`CostingInterpreter` runs the graph once and charges each node's FLOPs,
output bytes and the tensors autograd saves to the block running it, and notes
per node what recomputation needs (random draws, storages written in place);
:func:`measure` times each block over repeated runs.  The method is described
in :mod:`partitioning.cost.costing`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node
from torch.utils.flop_counter import FlopCounterMode

from common.errors import UserError
from partitioning.cost.crossing import NodeCosts
from partitioning.cost.slices import OpFacts
from stateless.torch_internals import TorchDispatchMode, op_schema, storage_id, tree_leaves, view_base


def tensor_bytes(value: Any) -> int:
    return sum(leaf.numel() * leaf.element_size() for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor))


def _describe(node: Node, value: Any) -> str:
    tensors = [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]
    shapes = ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in tensors)
    return f"{node.name}: {shapes}"


def _storage(tensor: torch.Tensor) -> int | None:
    try:
        return storage_id(tensor)
    except (NotImplementedError, RuntimeError):  # a tensor without storage
        return None


class _OpRecorder(TorchDispatchMode):
    """Notes, for the node running, the random draws and the storages written in place (aten schemas say which)."""

    def __init__(self) -> None:
        super().__init__()
        self.node: Node | None = None
        self.random: set[Node] = set()
        self.written: dict[Node, set[int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        assert self.node is not None
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.random.add(self.node)
        schema = op_schema(func)
        if schema.is_mutable:
            given = list(args) + [kwargs.get(spec.name) for spec in schema.arguments[len(args):]]
            for spec, arg in zip(schema.arguments, given):
                if spec.alias_info is not None and spec.alias_info.is_write:
                    for tensor in tree_leaves(arg):
                        if isinstance(tensor, torch.Tensor) and _storage(tensor) is not None:
                            self.written.setdefault(self.node, set()).add(_storage(tensor))  # type: ignore[arg-type]
        return func(*args, **kwargs)


class CostingInterpreter(Interpreter):
    """Runs the graph once, charging FLOPs, output bytes and saved tensors to the running block."""

    def __init__(self, graph_module: GraphModule, block_of: dict[Node, int], blocks: int) -> None:
        super().__init__(graph_module, garbage_collect_values=True)
        self.block_of = block_of
        self.flops = [0] * blocks
        self.saved: list[dict[int, int]] = [{} for _ in range(blocks)]  # id(base) -> bytes, per block
        self.value_bytes: dict[Node, int] = {}
        self.descriptions: dict[Node, str] = {}
        self.nodes = NodeCosts()
        self._owner: dict[int, Node] = {}  # storage -> the node that first produced a tensor on it
        self._recorder = _OpRecorder()
        self._current = 0
        self._counter: FlopCounterMode | None = None
        self._keep: list[Any] = []  # keeps ids (saved tensors, storages) unique while the run lasts

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        base = view_base(tensor)
        base = tensor if base is None else base
        if not (base.is_leaf and base.requires_grad):
            self.saved[self._current].setdefault(id(base), base.numel() * base.element_size())
            self._keep.append(base)
        return tensor

    def run_node(self, n: Node) -> Any:
        self._current = self.block_of[n]
        assert self._counter is not None
        before = self._counter.get_total_flops()
        self._recorder.node = n
        value = super().run_node(n)
        flops = self._counter.get_total_flops() - before
        self.flops[self._current] += flops
        self._note(n, value, flops)
        if n.op != "get_attr":
            self.value_bytes[n] = tensor_bytes(value)
            if self.value_bytes[n]:
                self.descriptions[n] = _describe(n, value)
        return value

    def _note(self, n: Node, value: Any, flops: int) -> None:
        """Per-node facts for recomputation: FLOPs, fresh bytes written (views write none), gradient, tensors."""
        tensors = [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]
        self.nodes.flops[n] = flops
        self.nodes.tensors[n] = [(str(t.dtype).removeprefix("torch."), tuple(t.shape)) for t in tensors]
        self.nodes.grad[n] = any(t.requires_grad for t in tensors)
        fresh = 0
        for tensor in tensors:
            storage = _storage(tensor)
            if storage is not None and storage not in self._owner:
                self._owner[storage] = n
                self._keep.append(tensor)
                fresh += tensor.numel() * tensor.element_size()
        self.nodes.written[n] = fresh

    def facts(self) -> OpFacts:
        writes = {node: {self._owner[s] for s in storages if s in self._owner}
                  for node, storages in self._recorder.written.items()}
        return OpFacts(random=set(self._recorder.random), writes={n: w for n, w in writes.items() if w})

    def cost(self, *args: Any) -> Any:
        with FlopCounterMode(display=False) as counter:
            self._counter = counter
            with self._recorder, torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor):
                try:
                    output = self.run(*args)
                except AssertionError as exc:
                    if self._recorder.node is None or self._recorder.node.target is not torch._assert:
                        raise
                    # a check of the model's own (a recipe's fact kept as torch._assert) refuses the planned input
                    said = " ".join(str(exc).split("While executing")[0].split())  # fx appends the node, the graph
                    raise UserError(f"the model refuses the planned input: {said[:200]}") from None
        self._counter = None
        return output


class _TimingInterpreter(Interpreter):
    def __init__(self, graph_module: GraphModule, block_of: dict[Node, int], blocks: int,
                 sync: Callable[[], None], clock: Callable[[], float]) -> None:
        super().__init__(graph_module, garbage_collect_values=True)
        self.block_of, self.sync, self.clock = block_of, sync, clock
        self.seconds = [0.0] * blocks
        self._current, self._since = 0, 0.0

    def run_node(self, n: Node) -> Any:
        block = self.block_of[n]
        if block != self._current:
            self.sync()
            now = self.clock()
            self.seconds[self._current] += now - self._since
            self._current, self._since = block, now
        return super().run_node(n)

    def time(self, *args: Any) -> list[float]:
        self.sync()
        self._since = self.clock()
        self.run(*args)
        self.sync()
        self.seconds[self._current] += self.clock() - self._since
        return self.seconds


def measure(graph_module: GraphModule, block_of: dict[Node, int], blocks: int, args: list[Any],
            repeats: int, clock: Callable[[], float]) -> list[float]:
    """Each block's seconds per run: the median over ``repeats`` runs after a warm-up run."""
    devices = {a.device for a in args if isinstance(a, torch.Tensor)}
    if any(d.type == "meta" for d in devices):
        raise UserError("wall time cannot be measured on the meta device")
    cuda = any(d.type == "cuda" for d in devices)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    _TimingInterpreter(graph_module, block_of, blocks, sync, clock).time(*args)  # warm-up: allocator, kernels
    runs = [_TimingInterpreter(graph_module, block_of, blocks, sync, clock).time(*args) for _ in range(repeats)]
    return [statistics.median(run[i] for run in runs) for i in range(blocks)]
