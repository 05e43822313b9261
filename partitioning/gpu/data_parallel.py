"""Data parallelism over a pipeline stage: torch's ``DistributedDataParallel`` as the engine expects it.

See :mod:`partitioning.gpu.pipelining` (a device mesh of ``dp`` x ``pp`` ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from stateless.torch_internals import ignore_in_data_parallel


class StageDDP(DistributedDataParallel):
    """DDP over a traced stage module, which the engine reads the graph of."""

    @property
    def graph(self) -> torch.fx.Graph:  # the engine reads its stage module's graph (the traced frontend)
        graph = self.module.graph
        assert isinstance(graph, torch.fx.Graph), type(self.module)
        return graph


def data_parallel(stage: Any, module: nn.Module, tied: Sequence[str], group: dist.ProcessGroup,
                  device: torch.device) -> None:
    """Wrap ``stage``'s module in DDP over its replicas' ``group``; the ``tied`` copies are summed by the caller."""
    ignore_in_data_parallel(module, tied)
    if any(p.requires_grad for name, p in module.named_parameters() if name not in tied):
        # the engine sees DDP and runs every backward but a step's last under no_sync()
        stage.submod = StageDDP(module, process_group=group, broadcast_buffers=False,
                                device_ids=[device] if device.type == "cuda" else None)
