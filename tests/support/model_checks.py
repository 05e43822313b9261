"""What every family's generated model is checked for, against stock transformers (shared by the families' tests).

A family's test module describes itself as a :class:`Family` (stock and generated modules, configs,
inputs per forward path, the one output read off the stock model); the checks here are the same for
all of them: equal eval outputs, equal same-seed training losses and gradients, traces that compute
what eager does, and the shared weight's stateless form.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from families.family import ModelFamily

Inputs = dict[str, torch.Tensor]


@dataclass
class Family:
    """One family at one release, as its tests see it."""

    name: str
    version: str
    stock: ModuleType  # transformers' modeling module
    generated: ModuleType  # ours
    make_config: Callable[[str], Any]  # config name -> config
    configs: tuple[str, ...]
    paths: dict[str, tuple[str, ...]]  # class -> its forward paths (which inputs it gets, which output it gives)
    make_inputs: Callable[..., Inputs]  # (masks, batch=, seed=, **lengths) -> every input any path takes
    call_kwargs: Callable[[str, Inputs, str], Inputs]  # (class, inputs, path) -> the call's keyword arguments
    reference_output: Callable[[str, Any, Inputs], torch.Tensor]  # (class, stock output, kwargs) -> the one value
    lengths: dict[str, int] = field(default_factory=dict)  # the sequence lengths of make_inputs' other shape
    # (config, batch size, seed) -> a training batch of the default class (masks with padding, ignored labels)
    train_batch: Callable[[Any, int, int], Inputs] | None = None
    train_lengths: dict[str, int] = field(default_factory=dict)  # the sequence lengths train_batch makes
    # the inputs the shared embedding embeds, each a use of the shared weight (GPT-2 embeds token types with wte;
    # BERT has an embedding of its own for them)
    embedded_inputs: tuple[str, ...] = ("input_ids", "token_type_ids", "decoder_input_ids")

    @property
    def model_family(self) -> ModelFamily:
        return ModelFamily.load(self.name, self.version)

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(self.paths)

    def cases(self) -> list[tuple[str, str]]:
        return [(cls, path) for cls, paths in self.paths.items() for path in paths]

    def pair(self, class_name: str, config_name: str, seed: int = 0) -> tuple[Any, Any]:
        """The stock and the generated model holding the same weights.

        Typed Any: mypy sees neither a transformers model's attributes nor a generated one's (imported by name).
        """
        config = self.make_config(config_name)
        torch.manual_seed(seed)
        reference = getattr(self.stock, class_name)(config)
        converted = getattr(self.generated, class_name)(config)
        converted.load_state_dict(reference.state_dict(), strict=True)
        return reference, converted

    def shared_key(self, class_name: str) -> str | None:
        """The stock state-dict key of the weight the stateless form makes one top-level parameter."""
        weights = self.model_family.definition.shared[class_name]
        return f"{weights[0].module}.weight" if weights else None

    def shared_weight(self, class_name: str) -> str | None:
        weights = self.model_family.definition.shared[class_name]
        return weights[0].weight if weights else None


def scalar(value: torch.Tensor) -> torch.Tensor:
    """A loss as it is, any other output weighted by position (so every element's gradient differs)."""
    return value if value.dim() == 0 else (value * torch.linspace(-1, 1, value.numel()).view_as(value)).sum()


def eval_outputs(family: Family, class_name: str, reference: nn.Module, converted: nn.Module,
                 kwargs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    reference.eval(), converted.eval()
    with torch.no_grad():
        expected = family.reference_output(class_name, reference(**kwargs), kwargs)
        actual = converted(**kwargs)
    assert isinstance(actual, torch.Tensor)
    return actual, expected


def train_step(family: Family, class_name: str, reference: nn.Module, converted: nn.Module, kwargs: Inputs,
               seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    """One same-seed training forward and backward of both models; their losses."""
    reference.train(), converted.train()
    torch.manual_seed(seed)
    expected = scalar(family.reference_output(class_name, reference(**kwargs), kwargs))
    expected.backward()
    torch.manual_seed(seed)
    actual = scalar(converted(**kwargs))
    actual.backward()
    return actual, expected


def assert_equal_gradients(converted: nn.Module, reference: nn.Module,
                           renamed: Mapping[str, str] | None = None) -> int:
    """Every parameter's gradient equal to the stock one of the same name (``renamed``: ours -> stock); how many."""
    grads = {name: p.grad for name, p in reference.named_parameters()}
    compared = 0
    for name, parameter in converted.named_parameters():
        stock_name = (renamed or {}).get(name, name)
        assert stock_name in grads, name
        expected = grads[stock_name]
        assert (parameter.grad is None) == (expected is None), name
        if parameter.grad is not None and expected is not None:
            assert torch.equal(parameter.grad, expected), name
            compared += 1
    return compared


# -- tracing ---------------------------------------------------------------------------------------------------

def absent(module: nn.Module, kwargs: Mapping[str, Any]) -> dict[str, None]:
    """concrete_args for every optional input the call does not pass."""
    parameters = inspect.signature(module.forward).parameters
    return {name: None for name in parameters if name not in kwargs}


def fx_trace(module: nn.Module, kwargs: Mapping[str, Any]) -> torch.fx.GraphModule:
    return torch.fx.symbolic_trace(module, concrete_args=absent(module, kwargs))


def assert_clean_graph(graph: torch.fx.Graph) -> None:
    """No None check, functional dropout or baked training flag left in a traced graph."""
    for node in graph.nodes:
        assert node.target not in (operator.is_, operator.is_not), node.format_node()
        assert node.target is not F.dropout, f"functional dropout left in the graph: {node.format_node()}"
        assert not isinstance(node.kwargs.get("training"), bool), node.format_node()


def dropout_nodes(graph_module: torch.fx.GraphModule) -> int:
    return sum(1 for n in graph_module.graph.nodes
               if n.op == "call_module" and isinstance(graph_module.get_submodule(n.target), nn.Dropout))


def assert_train_trace_follows_mode(module: nn.Module, kwargs: Inputs) -> None:
    """A graph traced in train mode runs like the model in eval after ``.eval()`` and in train after ``.train()``."""
    module.train()
    graph_module = fx_trace(module, kwargs)
    graph_module.eval(), module.eval()
    with torch.no_grad():
        first, second = graph_module(**kwargs), graph_module(**kwargs)
        assert torch.equal(first, second), "gm.eval() left a dropout active"
        assert torch.equal(first, module(**kwargs))
    graph_module.train(), module.train()
    torch.manual_seed(7)
    traced_train = graph_module(**kwargs)
    torch.manual_seed(7)
    eager_train = module(**kwargs)
    assert torch.equal(traced_train, eager_train)
    assert not torch.equal(traced_train, first), "gm.train() did not turn dropout back on"


def shared_weight_uses(graph: torch.fx.Graph, weight: str) -> int:
    """How many nodes use the shared weight, which must be one graph input (one get_attr)."""
    nodes = [n for n in graph.nodes if n.op == "get_attr" and n.target == weight]
    assert len(nodes) == 1, f"the shared weight must be one graph input, found {len(nodes)}"
    return len(nodes[0].users)
