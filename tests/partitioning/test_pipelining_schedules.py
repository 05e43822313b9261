"""The multi-stage schedules (V chunks per rank) train as one process does: torchrun, 2 gloo ranks, 4 chunks.

Every schedule of torch 2.13 that runs several chunks per rank (interleaved 1F1B, looped BFS, interleaved
zero bubble, ZBV zero bubble, DualPipeV), on T5 and GPT-2, tied and untied, with recomputation (T5's
position biases replayed, their gradients returned, across chunks of one rank and of two): per-micro-batch
losses, every gradient and the weights after 3 Adam steps are ``torch.equal`` to single-process training,
and every copy of a tied weight is the same tensor.

Zero-bubble schedules run the engine's own split backward (input gradients in I, weight gradients in W)
and stay bit-equal: W adds each weight's per-micro-batch gradient to ``.grad`` in micro-batch order, as
single-process accumulation does.  The chunks the runtime keeps on a whole backward in I (those linked by
a returned gradient, those sending a value made from weights alone: ``partitioning.gpu.pipelining``) are
covered by the recomputing T5 cases; the engine's split itself by GPT-2 (every chunk) and by T5 planned
without recomputation (``send``: chunks 1 and 3 split, 0 and 2 send a position bias).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_pipelining import CROSS, DEC_BIAS, DEC_POSITION, ENC_BIAS, ENC_POSITION, assert_equal_to_reference, launch

T5_SPLIT = "encoder.block.1,decoder.embed,decoder.block.1"  # chunks: encoder 0 | encoder 1 | decoder 0 | decoder 1
T5_TIED = {DEC_BIAS: [2, 3], ENC_BIAS: [0, 1], "shared_embed_weight": [0, 2, 3]}
T5_REPLAYED = {1: [ENC_POSITION], 3: [CROSS, DEC_POSITION]}
T5_CASES: dict[str, tuple[dict | None, dict]] = {
    f"2layer-gelu-tied:interleaved1f1b:4:{T5_SPLIT}": (T5_TIED, T5_REPLAYED),
    f"2layer-gelu-tied:loopedbfs:2:{T5_SPLIT}": (T5_TIED, T5_REPLAYED),
    f"2layer-gelu-tied:interleavedzerobubble:4:{T5_SPLIT}": (T5_TIED, T5_REPLAYED),
    # V: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 (passed in memory)
    f"2layer-gelu-tied:zbvzerobubble:4:{T5_SPLIT}": (T5_TIED, T5_REPLAYED),
    f"2layer-gelu-tied:dualpipev:4:{T5_SPLIT}": (T5_TIED, T5_REPLAYED),
    # the engine's split backward in chunks 1 and 3; 0 and 2 send a position bias (made from weights alone)
    f"2layer-gelu-untied:interleavedzerobubble:4:{T5_SPLIT}:send": ({"shared_embed_weight": [0, 2]}, {}),
    f"2layer-gelu-untied:zbvzerobubble:4:{T5_SPLIT}:send": ({"shared_embed_weight": [0, 2]}, {}),
}
GPT2_CASES: dict[str, tuple[dict | None, dict]] = {
    "2layer-untied:interleaved1f1b:4:transformer.h.0,transformer.h.1,final": ({}, {}),
    "2layer-untied:loopedbfs:2:transformer.h.0,transformer.h.1,final": ({}, {}),
    # tied embedding and head: chunks 0 and 3, on two ranks (looped) or one (V)
    "3layer-tied-relu-inner:interleavedzerobubble:4:transformer.h.0,transformer.h.2,final": (
        {"shared_embed_weight": [0, 3]}, {}),
    "3layer-tied-relu-inner:zbvzerobubble:4:transformer.h.0,transformer.h.2,final": (
        {"shared_embed_weight": [0, 3]}, {}),
    "3layer-tied-relu-inner:dualpipev:4:transformer.h.0,transformer.h.2,final": ({"shared_embed_weight": [0, 3]}, {}),
}


@pytest.mark.parametrize("family,cases", [("t5", T5_CASES), ("gpt2", GPT2_CASES)], ids=["t5", "gpt2"])
def test_multi_chunk_schedules_equal_single_process_training(tmp_path: Path, family: str,
                                                             cases: dict[str, tuple[dict | None, dict]]) -> None:
    assert_equal_to_reference(launch(2, list(cases), tmp_path, family), cases)
