"""stateless.autocast.maybe_autocast: torch.autocast only where it changes something (the 4.x rotary embeddings).

Stock's ``with torch.autocast(device_type, enabled=False)`` is recorded by torch.export as a submodule
(``wrap_with_autocast``) that pipelining's split cannot send around; where autocast is off already the
generated code enters no context, and torch.export records plain ops.  Inside a caller's autocast region it
is the same ``torch.autocast(enabled=False)``: float32 as stock.
"""

from __future__ import annotations

import torch

from stateless.autocast import maybe_autocast


class Rotary(torch.nn.Module):
    def __init__(self, context: object) -> None:
        super().__init__()
        self.context = context

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.context(device_type="cpu", enabled=False):  # type: ignore[operator]
            return (x @ x.transpose(0, 1)).cos()


def higher_order_ops(module: torch.nn.Module, x: torch.Tensor) -> list[str]:
    graph = torch.export.export(module, (x,), strict=False).graph_module.graph
    return [str(node.target) for node in graph.nodes if "wrap_with_autocast" in str(node.target)]


def test_no_context_where_autocast_is_off_the_same_one_where_it_is_on() -> None:
    x = torch.randn(3, 4)
    assert higher_order_ops(Rotary(torch.autocast), x) != []  # what stock's region becomes
    assert higher_order_ops(Rotary(maybe_autocast), x) == []
    assert torch.equal(Rotary(maybe_autocast)(x), Rotary(torch.autocast)(x))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert isinstance(maybe_autocast("cpu", enabled=False), torch.autocast)
        got, stock = Rotary(maybe_autocast)(x), Rotary(torch.autocast)(x)
    assert got.dtype == torch.float32 and torch.equal(got, stock)
    assert not isinstance(maybe_autocast("cpu", enabled=False), torch.autocast)


def test_no_context_on_meta() -> None:
    """A model traced on ``meta`` (train-model's ranks, before loading their stages): torch has no autocast state
    for ``meta`` (``torch.is_autocast_enabled("meta")`` raises), so no context, as transformers 5.x's."""
    x = torch.empty(3, 4, device="meta")

    class OnMeta(Rotary):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with maybe_autocast(device_type=x.device.type, enabled=False):
                return (x @ x.transpose(0, 1)).cos()

    assert OnMeta(maybe_autocast)(x).device.type == "meta"
    assert higher_order_ops(OnMeta(maybe_autocast), x) == []
