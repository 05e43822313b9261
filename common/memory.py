"""What a rank's process does so that its resident memory is its stage's tensors, not glibc's heap.

Measured on a 4-stage gpt2-medium (``scripts/bench_train.py``): glibc raises
its mmap threshold each time a large block is freed, so from then on tensors
of up to 32 MB come from the heap, and the heap keeps the pages freed in it
(activations of every micro-batch, the weights the stock initialisers filled
before the meta build moved them away).  That held 100 to 760 MB per rank,
at random, above the stage's weights, gradients and AdamW state.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
THRESHOLD = 128 << 10  # glibc's own initial value, kept fixed


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def return_large_frees() -> None:
    """Blocks of 128 KiB and more are mapped and unmapped on their own, for the rest of the process.

    ``mallopt`` with a fixed threshold turns glibc's dynamic raise off.  A
    ``MALLOC_MMAP_THRESHOLD_`` the user set in the environment wins.  Not glibc: nothing.
    """
    libc = _libc()
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD)


def release_freed_memory() -> None:
    """Hand the heap pages freed so far back to the OS (glibc's ``malloc_trim``; elsewhere nothing).

    Some stock initialisers fill a weight on the CPU before registering it
    (GPT-2's ``Conv1D``: ``torch.empty`` then ``normal_``), so building the
    model on ``meta`` touches each such weight once; a user's process that
    did not call :func:`return_large_frees` keeps those pages otherwise.
    """
    libc = _libc()
    if hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
