"""Every schedule of torch 2.13 on 4 gloo ranks trains as one process does (T5: one torchrun launch, 8 chunks).

The multi-chunk schedules run V = 2 chunks per rank (8 chunks: looped, rank r holding chunks r and r + 4,
or a V, rank r holding r and 7 - r), GPipe and 1F1B one; T5 tied, with recomputation (the position biases
replayed, their gradients returned across ranks), and untied with every value sent (the engine's own split
backward in each chunk but the two sending a position bias).  Per-micro-batch losses, every gradient, the
weights after 3 Adam steps and every tied replica are ``torch.equal`` to single-process training, except
under LoopedBFS: its backwards run from the last micro-batch down, so every weight gradient is summed over
micro-batches in reverse order, equal up to that order (``allclose``, rtol 1e-5, atol 1e-6; with m = 2,
as in the 2-rank test, the two-term sums are exact).
GPT-2 (tied wte / lm_head, 3 layers cut inside them: ``sublayers``, 9 blocks) runs the same schedules in a second
launch, 8 chunks: looped, the embedding's chunk on rank 0 and the head's on rank 3; a V, both on rank 0. Untied
(2 layers), 1F1B.
4 ranks on this project's 2-core CI machine are oversubscribed: one launch per family, several cases.
"""

from __future__ import annotations

from pathlib import Path

from test_pipelining import CROSS, DEC_POSITION, ENC_POSITION, assert_equal_to_reference, launch

# chunks: encoder.embed | block 0 | block 1 | encoder.final | decoder.embed | block 0 | block 1 | block 2 .. lm_head
TIED_SPLIT = "encoder.block.0,encoder.block.1,encoder.final,decoder.embed,decoder.block.0,decoder.block.1,decoder.block.2"
# untied (9 blocks): the last chunk is decoder.final and lm_head
UNTIED_SPLIT = "encoder.block.0,encoder.block.1,encoder.final,decoder.embed,decoder.block.0,decoder.block.1,decoder.final"
# encoder block 0 rebuilds the extended mask from the mask it receives anyway, encoder block 1 replays the encoder's
# bias; the same in the decoder (its causal mask), decoder blocks 1 and 2 replay its bias and the cross-attention's
REPLAYED = {1: ["encoder"], 2: [ENC_POSITION], 5: ["decoder"], 6: [CROSS, DEC_POSITION], 7: [CROSS, DEC_POSITION]}
FOUR_RANKS: dict[str, tuple[dict | None, dict]] = {
    "2layer-gelu-tied:gpipe:4:encoder.block.1,decoder.embed,decoder.block.1": (
        None, {1: [ENC_POSITION], 3: [CROSS, DEC_POSITION]}),
    "2layer-gelu-tied:1f1b:4:encoder.block.1,decoder.embed,decoder.block.1": (
        None, {1: [ENC_POSITION], 3: [CROSS, DEC_POSITION]}),
    f"2layer-gelu-tied:interleaved1f1b:4:{TIED_SPLIT}": (None, REPLAYED),
    # LoopedBFS runs each chunk's backwards from the last micro-batch down, so a weight's gradient accumulates
    # over micro-batches in reverse: equal to the reference up to that float summation order only
    # (measured: 1e-8 on gradients of 0.1; bound rtol 1e-5, atol 1e-6); with 2 micro-batches the sums are exact
    f"2layer-gelu-tied:loopedbfs:4:{TIED_SPLIT}:reordered": (None, REPLAYED),
    f"2layer-gelu-tied:interleavedzerobubble:4:{TIED_SPLIT}": (None, REPLAYED),
    f"2layer-gelu-tied:zbvzerobubble:4:{TIED_SPLIT}": (None, REPLAYED),
    f"2layer-gelu-tied:dualpipev:8:{TIED_SPLIT}": (None, REPLAYED),  # DualPipeV needs m >= 2K
    f"2layer-gelu-untied:interleavedzerobubble:4:{UNTIED_SPLIT}:send": (None, {}),
}


def test_every_schedule_on_four_ranks_equals_single_process_training(tmp_path: Path) -> None:
    assert_equal_to_reference(launch(4, list(FOUR_RANKS), tmp_path, "t5"), FOUR_RANKS)


# chunks: embed | h.0 attention | h.0 MLP | h.1 attention | h.1 MLP | h.2 attention | h.2 MLP + final | lm_head
GPT2_SPLIT = ("transformer.h.0.ln_1,transformer.h.0.ln_2,transformer.h.1.ln_1,transformer.h.1.ln_2,transformer.h.2.ln_1,"
              "transformer.h.2.ln_2,lm_head")
GPT2_TIED = {"shared_embed_weight": [0, 7]}
GPT2_FOUR_RANKS: dict[str, tuple[dict | None, dict]] = {
    "3layer-tied-relu-inner:gpipe:4:transformer.h.0.ln_2,transformer.h.1.ln_2,transformer.h.2.ln_2:sublayers": (
        {"shared_embed_weight": [0, 3]}, {}),
    "2layer-untied:1f1b:4:transformer.h.0.ln_2,transformer.h.1.ln_1,final:sublayers": ({}, {}),
    f"3layer-tied-relu-inner:interleaved1f1b:4:{GPT2_SPLIT}:sublayers": (GPT2_TIED, {}),
    f"3layer-tied-relu-inner:loopedbfs:4:{GPT2_SPLIT}:sublayers:reordered": (GPT2_TIED, {}),
    f"3layer-tied-relu-inner:interleavedzerobubble:4:{GPT2_SPLIT}:sublayers": (GPT2_TIED, {}),
    f"3layer-tied-relu-inner:zbvzerobubble:4:{GPT2_SPLIT}:sublayers": (GPT2_TIED, {}),
    f"3layer-tied-relu-inner:dualpipev:8:{GPT2_SPLIT}:sublayers": (GPT2_TIED, {}),
}


def test_every_schedule_on_four_ranks_trains_gpt2_as_one_process(tmp_path: Path) -> None:
    assert_equal_to_reference(launch(4, list(GPT2_FOUR_RANKS), tmp_path, "gpt2"), GPT2_FOUR_RANKS)
