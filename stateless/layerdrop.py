"""LayerDrop (Fan et al. 2019) as stock HuggingFace code draws it, in a form tracers record.

Stock code (BART and the models copied from it) draws ``random.uniform(0, 1)`` for
every layer of a stack on every forward, in train and eval mode alike, and skips
the layer when ``self.training`` and the draw is below ``layerdrop``.  A tracer
runs that Python once: the draw and the training flag become constants and every
call of the traced graph drops the same layers, or none.  Generated code instead
calls, per layer::

    dropped = self.layer_drop(self.layerdrop, hidden_states)   # a LayerDrop submodule
    def layer(hidden_states):
        ...                                                     # the stock layer code
        return hidden_states
    hidden_states = stateless.unless_dropped(dropped, layer, hidden_states)

**Eager** (a plain tensor, no compiler): the same draw from Python's ``random``
module at the same point, and a Python branch that skips the layer or runs it:
with the same ``random`` and torch seeds the computation is stock's, a skipped
layer runs nothing (its parameters get no gradient, its dropouts draw no torch
random numbers).

**Traced** (``torch.fx.symbolic_trace``, ``torch.export`` strict and non-strict,
FTPipe's tracer, ``torch.compile``): the decision is one recorded call that draws
anew from Python's ``random`` on every run of the graph (a custom op,
``stateless::layer_drop``, whose fake kernel gives export a 0-d bool), and the
layer always runs, its result selected by ``torch.where(dropped, input, output)``.
The value is stock's for the same draws; but a dropped layer's parameters get zero
gradients instead of none (an optimizer with momentum or weight decay still moves
them) and its dropouts still consume the torch generator, so later dropout masks
differ from an eager run's.  Under fx the decision reads the ``LayerDrop``
module's own ``training`` flag when the graph runs, so a graph traced in train
mode stops dropping after ``gm.eval()``; torch.export fixes the mode it traced in,
as it does for dropout.

A probability of 0 never drops: the decision is then a constant ``False`` tensor,
with no custom op in the graph, which backends that cannot run Python in a graph
(PopTorch) need, and the draw that keeps Python's ``random`` in step with stock
is made in Python: eagerly and in an fx graph on every call, in a non-strict
export once while tracing, under dynamo (strict export, ``torch.compile``) never.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
from torch import nn


@torch.library.custom_op("stateless::layer_drop", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def _layer_drop(p: float, training: bool) -> torch.Tensor:
    """Stock's decision: one ``random.uniform(0, 1)`` draw, below ``p`` in training mode."""
    draw = random.uniform(0, 1)
    return torch.tensor(training and draw < p)


@_layer_drop.register_fake
def _(p: float, training: bool) -> torch.Tensor:
    return torch.empty((), dtype=torch.bool)


def _decide(gate: LayerDrop, p: float, like: torch.Tensor) -> torch.Tensor:
    """The decision, as a 0-d bool tensor on the CPU (``like`` only gives fx a Proxy to record the call by)."""
    if gate.draws == "torch":
        # HF 4.35 on: one torch.rand([]) per layer in training only, from the generator dropout uses, so it
        # is drawn whatever p is (later dropout masks stay stock's); traced ops, which export records.
        return torch.rand([]) < p if gate.training else torch.zeros((), dtype=torch.bool)
    if gate.draws == "torch_positive":
        # HF 5.x: the same draw, made only when p > 0 (p is the config's number: a Python branch).
        return torch.rand([]) < p if gate.training and p > 0 else torch.zeros((), dtype=torch.bool)
    if p == 0:
        if not torch.compiler.is_compiling():  # dynamo refuses a Python draw in an exported graph
            random.uniform(0, 1)  # stock draws whatever the probability
        return torch.zeros((), dtype=torch.bool)
    return torch.ops.stateless.layer_drop(p, gate.training)


# symbolic_trace records _decide as one call, the gate as a get_attr of the traced module: the
# draw and the training flag are read when the graph runs.
torch.fx.wrap("_decide")


class LayerDrop(nn.Module):
    """Draws whether to skip a layer: ``forward(p, like)`` -> 0-d bool tensor; no parameters or buffers.

    Its ``training`` flag is the decision's, so ``.train()``/``.eval()`` of the model (or of a
    graph traced from it) switch layer drop on and off.  ``draws``: what stock draws from, Python's
    ``random`` on every call (``"random"``) or torch's generator in training only (``"torch"``, HF 4.35 on;
    ``"torch_positive"``, HF 5.x: in training only when ``p > 0``).
    """

    def __init__(self, draws: str = "random") -> None:
        super().__init__()
        if draws not in ("random", "torch", "torch_positive"):
            raise ValueError(f"LayerDrop draws from 'random', 'torch' or 'torch_positive', not {draws!r}")
        self.draws = draws

    def forward(self, p: float, like: torch.Tensor) -> torch.Tensor:
        return _decide(self, p, like)


def _eager(value: object) -> bool:
    """Whether ``value`` is a real tensor of an eager run (not an fx Proxy, a fake tensor, a tracer's wrapper)."""
    return type(value) is torch.Tensor and not torch.compiler.is_compiling()


def unless_dropped(dropped: torch.Tensor, layer: Callable[[torch.Tensor], torch.Tensor],
                   hidden_states: torch.Tensor) -> torch.Tensor:
    """``hidden_states`` if the layer is dropped, else ``layer(hidden_states)`` (see the module docstring)."""
    if _eager(dropped):
        return hidden_states if bool(dropped) else layer(hidden_states)
    return torch.where(dropped.to(hidden_states.device), hidden_states, layer(hidden_states))
