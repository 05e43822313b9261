"""retarget_devices: a stage traced on ``meta`` makes its own tensors on the run's device, not on ``meta``.

train-model traces the whole model on ``meta`` and loads only its stage.  A ``device=`` argument read off a
traced tensor (``torch.arange(n, device=x.device)`` of transformers 4.5x's causal masks, a ``.to(x.device)``)
is recorded as ``meta``: before the fix GPT-2 4.57.6 failed its first step with "Tensor on device meta is not
on the expected device cpu".  Traced on ``meta`` in this process, no ranks.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.pipelining import Pipe, SplitPoint

from partitioning.gpu.stage_graphs import retarget_devices
from stateless.torch_internals import annotate_split_points


class Masked(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        causal = torch.arange(x.shape[1], device=x.device)[None, :] <= torch.arange(x.shape[1], device=x.device)[:, None]
        keep = (causal[None] & mask.to(x.device)[:, None, :].bool()).float()
        return self.second(keep @ self.first(x))


def test_a_stage_traced_on_meta_runs_on_the_run_device() -> None:
    torch.manual_seed(0)
    eager = Masked()
    model = Masked().to("meta")
    annotate_split_points(model, {"second": SplitPoint.BEGINNING})
    x, mask = torch.randn(2, 3, 4), torch.tensor([[1, 1, 0], [1, 1, 1]])
    pipe = Pipe.from_tracing(model, (x.to("meta"), mask.to("meta")))
    stage = pipe.get_stage_module(0)
    names = [node.name for node in stage.graph.nodes if node.op == "placeholder"]
    inputs = [{"x": x, "mask": mask}[name] for name in names]  # positional, in the split graph's order
    stage.load_state_dict({k: v for k, v in eager.state_dict().items() if k.startswith("first.")}, assign=True)
    with pytest.raises(RuntimeError, match="meta"):
        stage(*inputs)
    retarget_devices(stage, torch.device("cpu"))
    retarget_devices(stage, torch.device("cpu"))  # idempotent
    got = stage(*inputs)
    got = got[0] if isinstance(got, tuple) else got
    causal = torch.ones(3, 3).tril().bool()
    assert torch.equal(got, (causal[None] & mask[:, None, :].bool()).float() @ eager.first(x))
