"""The thread count of a comparison across processes: fixed on both sides.

On an AVX-512 CPU torch's CPU matmuls give different last bits with 1 thread and with 2, so a reference
computed in the pytest process (default threads) and ranks run with ``OMP_NUM_THREADS=1`` need not be
``torch.equal``.  Every such reference runs under :func:`threads` with the ranks' count.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

RANK_THREADS = 1  # the OMP_NUM_THREADS every torchrun launch of the tests gives its ranks


@contextmanager
def threads(count: int = RANK_THREADS) -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
