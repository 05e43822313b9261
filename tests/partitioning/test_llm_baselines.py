"""torchtitan's and Hugging Face's native pipeline splits of a decoder-only chain (partitioning/solve/baselines.py)."""

from __future__ import annotations

import pytest

from common.errors import UserError
from partitioning.plan import Block
from partitioning.solve.baselines import hf_native_split, torchtitan_split

LISTS = ("model.layers",)


def llm_like(layers: int) -> list[Block]:
    names = ["embed_tokens", *(f"model.layers.{i}" for i in range(layers)), "norm", "lm_head"]
    return [Block(name, (name,), 1.0, 1, 0) for name in names]


def stages_of(blocks: list[Block], segments: list[tuple[int, int]]) -> list[list[str]]:
    return [[b.name.removeprefix("model.") for b in blocks[i:j + 1]] for i, j in segments]


def layer_counts(blocks: list[Block], segments: list[tuple[int, int]]) -> list[int]:
    return [sum(b.name.startswith("model.layers.") for b in blocks[i:j + 1]) for i, j in segments]


@pytest.mark.parametrize("layers,stages,expected", [
    # torchtitan's generate_llm_fqn_per_model_part with input_weight = output_weight = 1 (its defaults):
    (16, 4, [4, 5, 4, 3]),   # 18 effective layers: 5, 5, 4, 4; the embedding and the output take one each
    (32, 8, [4, 5, 4, 4, 4, 4, 4, 3]),  # 34 effective: 5, 5, then 4 each
    (28, 4, [7, 8, 7, 6]),   # 30: 8, 8, 7, 7
    (2, 4, [0, 1, 1, 0]),    # 4: one each; the first stage holds only the embedding, the last norm and head
])
def test_torchtitan_counts_the_embedding_and_the_output_as_layers(layers: int, stages: int,
                                                                  expected: list[int]) -> None:
    blocks = llm_like(layers)
    segments = torchtitan_split(blocks, stages, LISTS)
    assert layer_counts(blocks, segments) == expected
    names = stages_of(blocks, segments)
    assert names[0][0] == "embed_tokens" and names[-1][-2:] == ["norm", "lm_head"]
    assert all(end + 1 == start for (_, end), (start, _) in zip(segments, segments[1:]))


def test_torchtitan_refuses_more_stages_than_effective_layers() -> None:
    with pytest.raises(UserError, match="4 layers counting embedding and output, 5 stages"):
        torchtitan_split(llm_like(2), 5, LISTS)


@pytest.mark.parametrize("layers,stages,expected", [
    (32, 3, [10, 10, 12]),  # transformers' layer_range_for_rank docstring: the remainder on the last rank
    (16, 4, [4, 4, 4, 4]),
    (28, 8, [3, 3, 3, 3, 3, 3, 3, 7]),
])
def test_hf_native_split_is_uniform_over_model_layers_remainder_last(layers: int, stages: int,
                                                                     expected: list[int]) -> None:
    blocks = llm_like(layers)
    segments = hf_native_split(blocks, stages, LISTS)
    assert layer_counts(blocks, segments) == expected
    names = stages_of(blocks, segments)
    assert names[0][0] == "embed_tokens" and names[-1][-2:] == ["norm", "lm_head"]
