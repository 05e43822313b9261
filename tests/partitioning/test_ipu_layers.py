"""optimum-graphcore's layers_per_ipu: wildcard expansion and the stages it gives a plan's blocks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partitioning.ipu.errors import IPUError
from partitioning.ipu.layers import expand_layers_per_ipu, layer_ipus, manual_stages, recompute_blocks
from partitioning.plan import Block

LISTS = ("encoder.block", "decoder.block")


def t5_blocks(encoder: int, decoder: int) -> list[Block]:
    names = (["shared"] + [f"encoder.block.{i}" for i in range(encoder)] + ["encoder.final_layer_norm"]
             + [f"decoder.block.{i}" for i in range(decoder)] + ["decoder.final_layer_norm", "lm_head"])
    return [Block(name, (name,), flops=1.0, param_bytes=1, out_bytes=1) for name in names]


def test_optimum_graphcore_wildcard_example() -> None:
    assert layer_ipus([-1, 2, -1, 2], 7) == [0, 1, 1, 2, 2, 3, 3]


def test_all_wildcards_give_the_remainder_to_the_last_wildcard_ipu() -> None:
    assert expand_layers_per_ipu([-1, -1], 9) == [4, 5]
    assert expand_layers_per_ipu([-1, 1, -1, -1], 9) == [2, 1, 2, 4]


def test_counts_without_wildcards_must_sum_to_the_model() -> None:
    assert expand_layers_per_ipu([0, 3, 4, 5], 12) == [0, 3, 4, 5]
    with pytest.raises(IPUError, match="places 11 layers but the model has 12: make the counts sum to 12"):
        expand_layers_per_ipu([0, 3, 3, 5], 12)


def test_fixed_counts_above_the_model_are_rejected() -> None:
    with pytest.raises(IPUError, match="fixes more layers than the model's 7"):
        expand_layers_per_ipu([8, -1], 7)


@given(st.lists(st.integers(min_value=-1, max_value=6), min_size=1, max_size=8), st.integers(0, 40))
def test_expansion_keeps_fixed_counts_and_covers_every_layer(counts: list[int], layers: int) -> None:
    fixed = sum(c for c in counts if c != -1)
    if -1 not in counts and fixed != layers or -1 in counts and fixed > layers:
        with pytest.raises(IPUError):
            expand_layers_per_ipu(counts, layers)
        return
    expanded = expand_layers_per_ipu(counts, layers)
    assert sum(expanded) == layers
    assert all(e == c for e, c in zip(expanded, counts) if c != -1)
    wild = [e for e, c in zip(expanded, counts) if c == -1]
    if wild:  # an even share each, the remainder (less than one per wildcard) on the last
        assert len(set(wild[:-1])) <= 1
        assert wild[0] <= wild[-1] < wild[0] + len(wild)


def test_hub_layout_for_t5_small_puts_only_the_embedding_on_ipu_0() -> None:
    # optimum-graphcore's hub config for t5-small: layers_per_ipu [0, 3, 4, 5] over 6 + 6 layers.
    stages = manual_stages(t5_blocks(6, 6), [0, 3, 4, 5], LISTS)
    assert stages == [
        ("shared",),
        ("encoder.block.0", "encoder.block.1", "encoder.block.2"),
        ("encoder.block.3", "encoder.block.4", "encoder.block.5", "encoder.final_layer_norm", "decoder.block.0"),
        ("decoder.block.1", "decoder.block.2", "decoder.block.3", "decoder.block.4", "decoder.block.5",
         "decoder.final_layer_norm", "lm_head"),
    ]


def test_a_block_of_several_layers_cannot_be_split() -> None:
    blocks = [Block("encoder.block.0-1", ("encoder.block.0", "encoder.block.1"), 1.0, 1, 1),
              Block("encoder.block.2", ("encoder.block.2",), 1.0, 1, 1)]
    with pytest.raises(IPUError, match="splits block 'encoder.block.0-1' over IPUs \\[0, 1\\]"):
        manual_stages(blocks, [1, 2], LISTS)


def test_an_ipu_left_without_blocks_is_rejected() -> None:
    with pytest.raises(IPUError, match="leaves IPU 3 without blocks"):
        manual_stages(t5_blocks(2, 2), [1, 1, 2, 0], LISTS)


def test_recompute_checkpoints_every_layer_but_the_last_of_each_list() -> None:
    assert recompute_blocks(t5_blocks(3, 2), LISTS) == ["encoder.block.0", "encoder.block.1", "decoder.block.0"]
