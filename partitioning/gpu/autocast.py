"""Mixed precision for pipeline stages: each chunk's forward under ``torch.autocast``, its backward outside it.

That is what one process does (``with torch.autocast(...): loss = model(...)``, then
``loss.backward()``), and the weights, their gradients and the optimizer state stay fp32.

The stage graphs keep the dtypes their values had when traced, and the engine
sizes its receive buffers from them, so the model is traced under the same
autocast.  Autocast acts on CPU and CUDA tensors, not on ``meta`` ones: a
model on ``meta`` is traced on tensors of the run's device type that have no
data yet (``torch.empty``: on CPU address space only, no page is touched),
and every stage goes back to ``meta`` before its rank loads its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from stateless.torch_internals import own_buffers, own_parameters

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}  # fp16 with a loss scale: partitioning/train/loss_scale.py


def on_meta(model: nn.Module) -> bool:
    return any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])


def move(modules: Iterable[nn.Module], convert: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Replace every parameter and buffer of ``modules`` by ``convert`` of it; a tensor held under several
    names (or by several modules) stays one tensor."""
    done: dict[int, torch.Tensor] = {}
    for module in modules:
        for owner in module.modules():
            tables: tuple[dict[str, Any], ...] = (own_parameters(owner), own_buffers(owner))
            for table in tables:
                for leaf, tensor in list(table.items()):
                    if tensor is None:
                        continue
                    if id(tensor) not in done:
                        value = convert(tensor.detach())
                        done[id(tensor)] = (nn.Parameter(value, requires_grad=tensor.requires_grad)
                                            if isinstance(tensor, nn.Parameter) else value)
                    table[leaf] = done[id(tensor)]


def without_data(device_type: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: torch.empty(t.shape, dtype=t.dtype, device=device_type) if t.device.type == "meta" else t


def to_meta(t: torch.Tensor) -> torch.Tensor:
    return t.to("meta")


def under_autocast(module: nn.Module, device_type: str, dtype: torch.dtype) -> None:
    """``module``'s forward runs under autocast from now on (its backward does not)."""
    forward = module.forward

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            return forward(*args, **kwargs)

    module.forward = autocast_forward


def example_without_meta(example: dict[str, torch.Tensor], device_type: str) -> dict[str, torch.Tensor]:
    convert = without_data(device_type)
    return {name: convert(value) for name, value in example.items()}

