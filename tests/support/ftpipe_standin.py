"""A STAND-IN for FTPipe's tracer (saareliad/FTPipe, ``autopipe/autopipe/model_profiling/tracer.py``).

The real tracer runs only inside FTPipe's tool chain (pandas, scikit-learn,
networkx, two patches on torch 2.13; see FACTS.md), so CI traces with this
re-implementation of the semantics generated code meets there, and nothing else:

* **Every value is wrapped.**  The model's inputs, every argument a parent
  passes to a submodule (``None``, ints and bools included), a non-leaf
  module's own parameters and buffers, and every result computed from a
  wrapped value.  A wrapper is never ``None``, so ``x is None`` is False on a
  wrapped ``None``.  Operations on wrapped values are recorded: torch
  functions (``__torch_function__``), attribute reads, method calls, the
  arithmetic, comparison and item operators.  ``bool()`` and ``len()`` return
  the real answer and are *not* recorded: the branch taken is baked into the
  graph (listed in :attr:`Graph.baked`).  A wrapper has no ``__iter__`` or
  ``__index__``; hashing it or ``in`` on it raises ``NotImplementedError``, so
  a module whose own parameters are wrapped cannot walk ``parameters()``
  (a set of them), as ``ModuleUtilsMixin.dtype`` does.  A dtype read off a
  wrapped tensor is wrapped too: ``torch.finfo`` refuses it.
* **Unused results are discarded.**  The recorded program keeps only what the
  output depends on (FTPipe's ``discard_unused_nodes``), plus the in-place
  operators (``x += y``) applied to it.  An in-place method whose result is
  unused (``mask.masked_fill_(m, 0)`` as a statement) or an item assignment
  ran while tracing but is not in the program: later reads of ``mask`` read
  the value before it (listed in :attr:`Graph.dropped`).
* **Every submodule is wrapped** in a layer object that replaces it in its
  parent and forwards attribute lookups to it (``isinstance`` sees the
  wrapper).  A leaf module (no children, or one of ``basic_blocks``) is one
  graph node called on unwrapped values, with the rebound functions below
  back to normal; a non-leaf module runs its Python ``forward`` on wrapped
  values.  A plain tensor reaching a wrapped submodule as an argument is an
  error (FTPipe asserts "tensor constants should not happen").
* **Rebound functions.**  While tracing, torch's tensor creation and joining
  functions (``torch.ones``, ``torch.cat``, ``torch.where``, ...) are rebound
  on the ``torch`` module to recorders, as are functions registered with
  ``traced=``; functions registered with ``untraced=`` (FTPipe's T5 task:
  ``operator.is_``, ``operator.is_not``) are rebound to versions that unwrap
  their arguments, run, and record nothing.  Rebinding is on the module
  attribute, so only calls spelled ``module.name(...)`` are affected.

:func:`trace` returns a :class:`Graph` that :meth:`Graph.run` executes on new
inputs, so a test can compare the recorded program, not just the traced run,
with eager.  Node counts are not FTPipe's (it prunes and splits constants).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from stateless.torch_internals import own_buffers, own_children, own_parameters

# torch's "creation ops" and "indexing, slicing, joining" functions FTPipe rebinds (its tensor_creation_ops).
REBOUND_TORCH = (
    "tensor", "sparse_coo_tensor", "as_tensor", "as_strided", "from_numpy", "zeros", "zeros_like", "ones",
    "ones_like", "arange", "range", "linspace", "logspace", "eye", "empty", "empty_like", "empty_strided", "full",
    "full_like", "quantize_per_tensor", "quantize_per_channel", "dequantize", "complex", "polar", "heaviside",
    "cat", "chunk", "dstack", "gather", "hstack", "index_select", "masked_select", "movedim", "narrow", "nonzero",
    "reshape", "scatter", "scatter_add", "split", "squeeze", "stack", "t", "take", "transpose", "unbind",
    "unsqueeze", "vstack", "where", "bartlett_window", "blackman_window", "from_file", "hamming_window",
    "hann_window", "rand", "randn", "randint", "randperm",
)
# What FTPipe's T5 task registers (autopipe/tasks/new_t5.py: T5Partitioner.register_functions).
T5_TASK_TRACED = ((math, "log"), (torch, "einsum"))
T5_TASK_UNTRACED = ((operator, "is_"), (operator, "is_not"))

# Values a wrapper may hold (FTPipe's is_traceable).
_TRACEABLE = (type(None), type(Ellipsis), list, tuple, dict, set, int, bool, str, float, slice, torch.device,
              torch.Size, torch.Tensor, torch.dtype, torch.memory_format)


class TraceError(RuntimeError):
    pass


@dataclass(frozen=True)
class Ref:
    index: int


@dataclass
class Node:
    kind: str  # "input", "constant", "parameter", "call", "module"
    target: Any  # input name, constant, tensor, callable or leaf module
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    scope: str = ""


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)
    output: Any = None  # a Ref, or a container of Refs and constants
    baked: list[str] = field(default_factory=list)  # "scope: bool(...)" / "len(...)" evaluated at trace time
    dropped: set[int] = field(default_factory=set)  # nodes the program does not run: the output does not use them

    def consumers(self, index: int) -> list[Node]:
        return [node for node in self.nodes if Ref(index) in _refs_in((node.args, node.kwargs))]

    def run(self, **inputs: Any) -> Any:
        """Execute the recorded program on ``inputs`` (same names as the traced call)."""
        values: list[Any] = []
        for index, node in enumerate(self.nodes):
            if index in self.dropped:
                values.append(None)
            elif node.kind == "input":
                values.append(inputs[node.target])
            elif node.kind in ("constant", "parameter"):
                values.append(node.target)
            else:
                args, kwargs = _resolve((node.args, node.kwargs), values)
                values.append(node.target(*args, **kwargs))
        return _resolve(self.output, values)


def _refs_in(obj: Any) -> Iterable[Ref]:
    if isinstance(obj, Ref):
        yield obj
    elif isinstance(obj, (list, tuple, set)):
        for item in obj:
            yield from _refs_in(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _refs_in(item)
    elif isinstance(obj, slice):
        yield from _refs_in((obj.start, obj.stop, obj.step))


def _resolve(obj: Any, values: list[Any]) -> Any:
    if isinstance(obj, Ref):
        return values[obj.index]
    if isinstance(obj, (list, tuple, set)):
        return type(obj)(_resolve(item, values) for item in obj)
    if isinstance(obj, dict):
        return {key: _resolve(item, values) for key, item in obj.items()}
    if isinstance(obj, slice):
        return slice(*_resolve((obj.start, obj.stop, obj.step), values))
    return obj


def _map(obj: Any, leaf: Callable[[Traced], Any]) -> Any:
    if isinstance(obj, Traced):
        return leaf(obj)
    if isinstance(obj, (list, tuple, set)):
        return type(obj)(_map(item, leaf) for item in obj)
    if isinstance(obj, dict):
        return {key: _map(item, leaf) for key, item in obj.items()}
    if isinstance(obj, slice):
        return slice(*_map((obj.start, obj.stop, obj.step), leaf))
    return obj


def _unwrap(obj: Any) -> Any:
    return _map(obj, lambda traced: traced._standin_value)


def _as_refs(obj: Any) -> Any:
    return _map(obj, lambda traced: Ref(traced._standin_index))


def _build(kind: type) -> Callable[..., Any]:
    if kind is dict:
        return lambda **items: dict(items)
    return lambda *items: kind(items)


class _Method:
    def __init__(self, name: str) -> None:
        self.name = name
        self.__name__ = f".{name}"

    def __call__(self, owner: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(owner, self.name)(*args, **kwargs)


class _Tracer:
    def __init__(self) -> None:
        self.graph = Graph()
        self.scope: list[str] = []
        self.recording = True  # False inside a leaf module, as FTPipe disables its rebinding there

    def add(self, kind: str, target: Any, value: Any, args: tuple = (), kwargs: dict | None = None) -> Traced:
        if not isinstance(value, _TRACEABLE):
            raise TraceError(f"{self.scope[-1]}: a wrapped value must be a basic type, got {type(value)}")
        self.graph.nodes.append(Node(kind, target, _as_refs(args), _as_refs(kwargs or {}), self.scope[-1]))
        return Traced(self, len(self.graph.nodes) - 1, value)

    def call(self, target: Callable[..., Any], args: tuple, kwargs: dict | None = None) -> Traced:
        kwargs = kwargs or {}
        value = target(*_unwrap(args), **_unwrap(kwargs))  # first: a failing call records nothing
        return self.add("call", target, value, args, kwargs)

    def wrap(self, value: Any) -> Traced:
        """An argument a parent passes (or a non-leaf module returns): constants and containers become nodes."""
        if isinstance(value, Traced):
            return value
        if isinstance(value, torch.Tensor):
            raise TraceError(f"{self.scope[-1]}: an untraced tensor was passed to a wrapped submodule "
                             "(FTPipe: 'tensor constants should not happen')")
        if isinstance(value, dict):
            items = {key: self.wrap(item) for key, item in value.items()}
            return self.add("call", _build(dict), _unwrap(items), (), items)
        if isinstance(value, (list, tuple, set, slice)) and not isinstance(value, torch.Size):
            parts = (value.start, value.stop, value.step) if isinstance(value, slice) else value
            builder = slice if isinstance(value, slice) else _build(type(value))
            wrapped = tuple(self.wrap(item) for item in parts)
            return self.add("call", builder, builder(*_unwrap(wrapped)), wrapped)
        return self.add("constant", value, value)

    def bake(self, what: str, traced: Traced) -> None:
        self.graph.baked.append(f"{self.scope[-1]}: {what}({self.describe(traced._standin_index)})")

    def describe(self, index: int, depth: int = 2) -> str:
        node = self.graph.nodes[index]
        if node.kind == "constant":
            return repr(node.target)
        if node.kind != "call" or depth == 0:
            return f"{node.kind}#{index}"
        name = getattr(node.target, "__name__", None) or repr(node.target)
        args = _map_refs(node.args, lambda ref: self.describe(ref.index, depth - 1))
        return f"{name}({', '.join(map(str, args))})"


def _map_refs(args: tuple, describe: Callable[[Ref], str]) -> list[Any]:
    return [describe(arg) if isinstance(arg, Ref) else arg for arg in args]


def _recorded(name: str) -> Callable[..., Any]:
    op = getattr(operator, name)

    def method(self: Traced, *args: Any) -> Traced:
        return self._standin_tracer.call(op, (self, *args))
    method.__name__ = f"__{name.strip('_')}__"
    return method


def _reflected(name: str) -> Callable[..., Any]:
    op = getattr(operator, name)

    def method(self: Traced, other: Any) -> Traced:
        return self._standin_tracer.call(op, (other, self))
    return method


class Traced:
    """A wrapped value (FTPipe's TracedValue): never ``None``, records what is done with it."""

    def __init__(self, tracer: _Tracer, index: int, value: Any) -> None:
        self._standin_tracer = tracer
        self._standin_index = index
        self._standin_value = value

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        return _first_tracer((args, kwargs)).call(func, tuple(args), kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_standin_"):
            raise AttributeError(name)
        value = getattr(self._standin_value, name)
        tracer = self._standin_tracer
        if callable(value) and not isinstance(value, _TRACEABLE):
            method = _Method(name)
            return lambda *args, **kwargs: tracer.call(method, (self, *args), kwargs)
        return tracer.call(getattr, (self, name))

    def __bool__(self) -> bool:
        self._standin_tracer.bake("bool", self)
        return bool(self._standin_value)

    def __len__(self) -> int:
        self._standin_tracer.bake("len", self)
        return len(self._standin_value)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._standin_tracer.call(operator.setitem, (self, key, value))

    def __hash__(self) -> int:
        raise NotImplementedError(f"tracing {type(self._standin_value).__name__}::__hash__ is currently not supported")

    def __contains__(self, item: Any) -> bool:
        raise NotImplementedError(f"tracing {type(self._standin_value).__name__}::__contains__ is currently not "
                                  "supported")

    def __repr__(self) -> str:
        return f"Traced#{self._standin_index}({self._standin_value!r})"


# FTPipe keeps a consumer of a kept node only if its scope names an in-place operator ("__i" in
# "/Tensor::__iadd__"; "__invert__" matches too).
_KEPT_CONSUMERS = frozenset(getattr(operator, name) for name in (
    "iadd", "isub", "imul", "imatmul", "itruediv", "ifloordiv", "imod", "ipow", "ilshift", "irshift", "iand",
    "ixor", "ior", "invert"))


def _discarded(graph: Graph) -> set[int]:
    """The nodes FTPipe's ``discard_unused_nodes`` removes: all but what the output is computed from."""
    consumers: dict[int, list[int]] = {}
    for index, node in enumerate(graph.nodes):
        for ref in _refs_in((node.args, node.kwargs)):
            consumers.setdefault(ref.index, []).append(index)
    kept: set[int] = set()
    todo = [ref.index for ref in _refs_in(graph.output)]
    while todo:
        index = todo.pop()
        if index in kept:
            continue
        kept.add(index)
        node = graph.nodes[index]
        todo += [ref.index for ref in _refs_in((node.args, node.kwargs))]
        todo += [user for user in consumers.get(index, ()) if graph.nodes[user].target in _KEPT_CONSUMERS]
    return set(range(len(graph.nodes))) - kept


def _first_tracer(obj: Any) -> _Tracer:
    found: list[_Tracer] = []
    _map(obj, lambda traced: found.append(traced._standin_tracer))
    return found[0]


for _name in ("getitem", "neg", "pos", "abs", "invert", "add", "sub", "mul", "matmul", "truediv", "floordiv",
              "mod", "pow", "lshift", "rshift", "and_", "xor", "or_", "iadd", "isub", "imul", "imatmul",
              "itruediv", "ifloordiv", "imod", "ipow", "ilshift", "irshift", "iand", "ixor", "ior",
              "eq", "ne", "ge", "gt", "le", "lt"):
    setattr(Traced, f"__{_name.strip('_')}__", _recorded(_name))
for _name in ("add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift", "and_",
              "xor", "or_"):
    setattr(Traced, f"__r{_name.strip('_')}__", _reflected(_name))


class Layer(nn.Module):
    """A wrapped submodule (FTPipe's TracedLayer): forwards attribute lookups, is not the module's class."""

    def __init__(self, module: nn.Module, name: str, leaf: bool, tracer: _Tracer) -> None:
        super().__init__()
        self._module = module
        self._standin_name = name
        self._standin_leaf = leaf
        self._standin_tracer = tracer

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._module, name)

    def __getitem__(self, key: Any) -> Any:
        return self._module[key]  # type: ignore[index]  # a ModuleList's item, as FTPipe's layer forwards it

    def __len__(self) -> int:
        return len(self._module)  # type: ignore[arg-type]  # a ModuleList's length, as FTPipe's layer forwards it

    def forward(self, *args: Any, **kwargs: Any) -> Traced:
        tracer = self._standin_tracer
        tracer.scope.append(self._standin_name)
        try:
            args = tuple(tracer.wrap(a) for a in args)
            kwargs = {k: tracer.wrap(v) for k, v in kwargs.items()}
            if self._standin_leaf:
                return self._leaf_call(args, kwargs)
            return _run_non_leaf(tracer, self._module, args, kwargs)
        finally:
            tracer.scope.pop()

    def _leaf_call(self, args: tuple, kwargs: dict) -> Traced:
        tracer = self._standin_tracer
        tracer.recording = False
        try:
            value = self._module(*_unwrap(args), **_unwrap(kwargs))
        finally:
            tracer.recording = True
        return tracer.add("module", self._module, value, args, kwargs)


def _run_non_leaf(tracer: _Tracer, module: nn.Module, args: tuple, kwargs: dict) -> Traced:
    """Run ``module``'s Python forward with its own parameters and buffers wrapped too."""
    stores: tuple[dict[str, Any], ...] = (own_parameters(module), own_buffers(module))
    own = [(store, name) for store in stores for name, value in store.items() if value is not None]
    originals = {(id(store), name): store[name] for store, name in own}
    for store, name in own:
        tracer.scope.append(f"{tracer.scope[-1]}.{name}")
        store[name] = tracer.add("parameter", store[name], store[name])
        tracer.scope.pop()
    try:
        out = module(*args, **kwargs)
    finally:
        for store, name in own:
            store[name] = originals[(id(store), name)]
    return tracer.wrap(out)


class _Rebound:
    def __init__(self, tracer: _Tracer, original: Callable[..., Any], traced: bool) -> None:
        self.tracer, self.original, self.traced = tracer, original, traced
        self.__name__ = getattr(original, "__name__", "function")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.traced:
            return self.original(*_unwrap(args), **_unwrap(kwargs))
        if not self.tracer.recording:
            return self.original(*args, **kwargs)
        return self.tracer.call(self.original, args, kwargs)


def _wrap_children(module: nn.Module, prefix: str, tracer: _Tracer, basic_blocks: tuple[type, ...],
                   undo: list[tuple[nn.Module, str, nn.Module]]) -> None:
    for name, child in list(own_children(module).items()):
        if child is None or isinstance(child, Layer):
            continue
        if isinstance(child, (nn.ParameterList, nn.ParameterDict)):
            continue
        leaf = not any(True for _ in child.children()) or isinstance(child, basic_blocks)
        qualified = f"{prefix}.{name}"
        if not leaf:
            _wrap_children(child, qualified, tracer, basic_blocks, undo)
        own_children(module)[name] = Layer(child, qualified, leaf, tracer)
        undo.append((module, name, child))


def trace(model: nn.Module, kwargs: dict[str, Any], *, traced: Iterable[tuple[Any, str]] = T5_TASK_TRACED,
          untraced: Iterable[tuple[Any, str]] = T5_TASK_UNTRACED,
          basic_blocks: tuple[type, ...] = ()) -> Graph:
    """Trace ``model(**kwargs)`` the way FTPipe's ``trace_module`` does; the model is restored afterwards."""
    tracer = _Tracer()
    rebinds = [(torch, name, True) for name in REBOUND_TORCH if hasattr(torch, name)]
    rebinds += [(namespace, name, True) for namespace, name in traced]
    rebinds += [(namespace, name, False) for namespace, name in untraced]
    saved = [(namespace, name, getattr(namespace, name)) for namespace, name, _ in rebinds]
    undo: list[tuple[nn.Module, str, nn.Module]] = []
    try:
        _wrap_children(model, type(model).__name__, tracer, basic_blocks, undo)
        for (namespace, name, is_traced), (_, _, original) in zip(rebinds, saved):
            setattr(namespace, name, _Rebound(tracer, original, is_traced))
        tracer.scope.append(type(model).__name__)
        inputs = {name: tracer.add("input", name, value) for name, value in sorted(kwargs.items())}
        with torch.no_grad():
            out = _run_non_leaf(tracer, model, (), inputs)
        tracer.graph.output = Ref(out._standin_index)
        tracer.graph.dropped = _discarded(tracer.graph)
        return tracer.graph
    finally:
        for namespace, name, original in saved:
            setattr(namespace, name, original)
        for parent, name, child in reversed(undo):
            own_children(parent)[name] = child
