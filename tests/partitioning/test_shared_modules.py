"""A module object registered under two parents, or also called by name (transformers 4.20's ACT2FN
activations), breaks the engine's split; copying each stateless leaf mends it and computes the same."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.pipelining import SplitPoint, pipeline

from partitioning.gpu.shared_modules import copy_stateless_leaves

GELU = nn.GELU()  # one instance, as 4.20's ACT2FN["gelu"] and its module-level ``gelu``


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(4, 4)
        self.act = GELU  # every block registers the same instance

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(GELU(x))  # the instance by name, unregistered here (4.20's RobertaLMHead does so)


class Model(nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
        self.head = Head()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.mark.parametrize(("blocks", "split"), [(2, "blocks.1"), (1, "head")])
def test_a_shared_stateless_module_breaks_the_split_and_copies_mend_it(blocks: int, split: str) -> None:
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="is not a descendant of parent module"):
        pipeline(Model(blocks), (x,), split_spec={split: SplitPoint.BEGINNING})  # (it annotates the model it splits)
    model = Model(blocks)
    expected = model(x)
    assert copy_stateless_leaves(model) == blocks  # each block's GELU; the Linears hold parameters
    assert GELU not in list(model.modules()) and len({id(b.act) for b in model.blocks}) == blocks
    pipe = pipeline(model, (x,), split_spec={split: SplitPoint.BEGINNING})
    assert pipe.num_stages == 2 and torch.equal(pipe(x)[0], expected)
