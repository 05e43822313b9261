"""Dropout whose rate is an argument of each call, for functions that receive the module."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _dropout(gate: FunctionalDropout, input: torch.Tensor, p: float) -> torch.Tensor:  # noqa: A002  # F's name
    return F.dropout(input, p, gate.training)


# symbolic_trace records _dropout as one call and the gate as a get_attr of the traced module: the
# training flag is read when the graph runs (the default tracer would trace through this module's
# forward, which is not torch.nn's, and bake the flag in).
torch.fx.wrap("_dropout")


class FunctionalDropout(nn.Module):
    """``F.dropout(input, p, training=<this module's mode>)`` as a submodule call.

    A module-level attention function of transformers 5.x takes the calling
    module and the rate and reads ``module.training``: tracers record that flag
    as the constant it was while tracing.  Through a submodule the flag is read
    when the graph runs, so a traced graph follows ``.train()``/``.eval()``; it
    makes the same ``F.dropout`` call, so seeded results are bit-equal.  The rate
    stays an argument because the function, not the module, knows it.
    """

    def forward(self, input: torch.Tensor, p: float = 0.5) -> torch.Tensor:  # noqa: A002  # F.dropout's name
        return _dropout(self, input, p)
