"""Evaluation through stage graphs traced in train mode: their dropout made switchable.

The engine traces the model once, in train mode, so each dropout is a node
that draws its mask whatever the module's ``training`` flag says later::

    dropout = torch.ops.aten.dropout.default(linear, 0.1, True)

:func:`switchable` points every such node at a function that draws exactly
as before while training (the same op, the same arguments, the same random
numbers) and, inside :func:`evaluating`, is what the op is in eval mode:
the input itself (attention's ``dropout_p`` made 0)::

    dropout = partitioning.gpu.eval_mode.dropout(linear, 0.1, True)

A node drawing random numbers for another reason (a layer-drop decision)
cannot be switched: :func:`switchable` names it, and evaluation is refused
rather than computed in train mode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from stateless.torch_internals import compiled_graph_module

aten = torch.ops.aten
_evaluating = False  # inside evaluating(): the switched ops act as in eval mode


def dropout(x: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    return aten.dropout.default(x, p, train and not _evaluating)


def feature_dropout(x: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    return aten.feature_dropout.default(x, p, train and not _evaluating)


def alpha_dropout(x: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    return aten.alpha_dropout.default(x, p, train and not _evaluating)


def feature_alpha_dropout(x: torch.Tensor, p: float, train: bool) -> torch.Tensor:
    return aten.feature_alpha_dropout.default(x, p, train and not _evaluating)


def native_dropout(x: torch.Tensor, p: float, train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    return aten.native_dropout.default(x, p, (train is not False) and not _evaluating)


def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> torch.Tensor:
    if _evaluating:  # dropout_p is the schema's fifth argument
        if len(args) > 4:
            args = (*args[:4], 0.0, *args[5:])
        else:
            kwargs = {**kwargs, "dropout_p": 0.0}
    return aten.scaled_dot_product_attention.default(*args, **kwargs)


SWITCHED: dict[Any, Callable[..., Any]] = {
    aten.dropout.default: dropout, aten.feature_dropout.default: feature_dropout,
    aten.alpha_dropout.default: alpha_dropout, aten.feature_alpha_dropout.default: feature_alpha_dropout,
    aten.native_dropout.default: native_dropout,
    aten.scaled_dot_product_attention.default: scaled_dot_product_attention,
}


def switchable(module: nn.Module) -> list[str]:
    """Point the dropout nodes of ``module``'s graphs (its submodules' too: the engine's stage modules hold
    torch.export's unflattened modules, each with a graph of its own) at the switchable ops; the names of the
    random nodes left as they are (what evaluation would run in train mode)."""
    left = []
    for name, owner in module.named_modules():
        graph = getattr(owner, "graph", None)
        if not isinstance(graph, torch.fx.Graph):
            continue
        compiled = owner if isinstance(owner, torch.fx.GraphModule) else compiled_graph_module(owner)
        graphs = [graph] + ([compiled.graph] if compiled is not None and compiled.graph is not graph else [])
        changed = False
        for index, each in enumerate(graphs):
            for node in each.nodes:
                if node.op != "call_function":
                    continue
                if node.target in SWITCHED:
                    node.target, changed = SWITCHED[node.target], True
                elif index == 0 and torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
                    left.append(f"{name + '.' if name else ''}{node.name} ({node.target})")
        if changed and compiled is not None:
            compiled.recompile()
    return left


@contextmanager
def evaluating() -> Iterator[None]:
    """The switched ops as in eval mode, with no autograd graph kept."""
    global _evaluating
    _evaluating = True
    try:
        with torch.no_grad():
            yield
    finally:
        _evaluating = False
