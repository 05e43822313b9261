"""Pipelined training on torch.distributed.pipelining equals single-process training (torchrun, gloo, CPU).

One stage per rank (GPipe, 1F1B) here; several per rank in test_pipelining_schedules.py.

Each launch runs several cases of one family in one process group (see pipelining_worker.py): a tiny
generated model (T5, GPT-2, BERT, RoBERTa, BART) with tied or untied embeddings, a plan, GPipe or 1F1B, 3 Adam
steps.  Per micro-batch losses, every
gradient (the tied weight's after the backend's sync) and the weights after the steps must be
torch.equal to the reference, and every replica of the tied weight identical.

Plans recompute what is cheaper to recompute than to send (T5's position biases, extended masks and
cross-attention bias): the stages must replay exactly the values their plan names, never receive
them, and the relative-attention tables they read are replicas whose gradient is the one weight's.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from support import REPO, SUPPORT, TORCHRUN
from support.t5_models import T5, config

from common.errors import UserError
from families.models import MicroBatch, SharedWeight
from partitioning.cost.chain import family_chain
from partitioning.gpu.pipelining import PipelineRun, split_spec
from partitioning.plan import Plan
from partitioning.solve.partition import Settings, build_plan


def launch(ranks: int, cases: list[str], out: Path, family: str = "t5") -> dict[str, list[dict]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([TORCHRUN, "--standalone", f"--nproc-per-node={ranks}", str(SUPPORT / "pipelining_worker.py"),
                             "--out", str(out), "--family", family, *cases], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    records: dict[str, list[dict]] = {}
    for path in sorted(out.glob("*.json")):
        record = json.loads(path.read_text())
        records.setdefault(record["case"], []).append(record)
    assert sorted(records) == sorted(cases) and all(len(r) == ranks for r in records.values())
    return records


ENC_BIAS, DEC_BIAS = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", \
    "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
ENC_POSITION, DEC_POSITION, CROSS = ("encoder.block.0.layer.0.SelfAttention", "decoder.block.0.layer.0.SelfAttention",
                                     "decoder.block.0.layer.1.EncDecAttention")


def assert_equal_to_reference(records: dict[str, list[dict]], expected: dict[str, tuple[dict | None, dict]]) -> None:
    """No problem on any rank; each chunk replays what its plan says; tied weights held where expected."""
    for case, ranks in records.items():
        tied, replayed = expected[case]
        for record in ranks:
            rank = record["rank"]
            assert record["problems"] == [], f"{case} rank {rank}: {record['problems'][:5]}"
            for chunk, keys in record["replayed"].items():
                assert keys == record["planned"][chunk], case  # the backend does what the plan says
                assert sorted(key.split(":")[0] for key in keys) == sorted(replayed.get(int(chunk), [])), case
            # a replayed value is never received: no stage input has a position bias's shape (masks left out: the
            # decoder's inverted encoder mask has the shape of the encoder's extended mask a chunk may rebuild)
            keys = [key for chunk_keys in record["replayed"].values() for key in chunk_keys
                    if "Attention" in key.split(":")[0]]
            biases = {tuple(int(n) for n in key.split("[")[1].rstrip("]").split(", ")) for key in keys}
            assert not biases & {tuple(shape) for shape in record["received"]}, case
            # GPipe, 1F1B and Interleaved1F1B sum a tied weight's use gradients as the backward runs: a copy holds
            # one micro-batch's at most; the schedules that split or reverse the backward sum after the schedule,
            # and hold every micro-batch's; allreduce keeps none
            schedule, micro_batches = case.rpartition("/")[2].split(":")[1:3]
            for most, uses in record["kept"]:
                kept = uses if schedule in ("gpipe", "1f1b", "interleaved1f1b") else int(micro_batches) * uses
                assert most == kept, (case, rank, record["kept"])
        held: dict[str, list[int]] = {}
        for record in ranks:
            for name, chunks in record["tied"].items():
                held[name] = sorted(held.get(name, []) + chunks)
        if tied is not None:
            assert held == tied, case
        names = [name for record in ranks for name in record["parameters"]]
        assert len(names) - len(set(names)) == sum(len(s) - 1 for s in held.values())  # only tied weights repeat


# config:schedule:micro-batches:split[:options] (split: first blocks of stages 1..K-1, or "optimal") ->
# (stages holding each replicated weight (None: not checked), {stage: modules of the values it recomputes})
TWO_RANKS: dict[str, tuple[dict | None, dict]] = {
    # lm_head with the decoder: nothing crosses that could be recomputed
    "1layer-relu-tied:gpipe:2:decoder.embed": ({"shared_embed_weight": [0, 1]}, {}),
    "2layer-gelu-tied:1f1b:4:lm_head": ({"shared_embed_weight": [0, 1]}, {}),  # both embeddings on stage 0
    # the encoder's position bias crosses: stage 1 recomputes it from a replica of its table, untied, GPipe
    "2layer-gelu-untied:gpipe:2:encoder.block.1": ({ENC_BIAS: [0, 1], "shared_embed_weight": [0, 1]},
                                                   {1: [ENC_POSITION]}),
    # the same with every value sent, as before recomputation
    "2layer-gelu-untied:gpipe:2:encoder.block.1:send": ({"shared_embed_weight": [0, 1]}, {}),
    # tied, 1F1B, the encoder's bias recomputed
    "2layer-gelu-tied:1f1b:4:encoder.block.1": ({ENC_BIAS: [0, 1], "shared_embed_weight": [0, 1]},
                                                {1: [ENC_POSITION]}),
    # the decoder's self-attention bias (gradient) and cross-attention bias (mask only), untied head
    "3layer-relu-untied-2dec:1f1b:2:decoder.block.1": ({DEC_BIAS: [0, 1]}, {1: [CROSS, DEC_POSITION]}),
}
THREE_RANKS: dict[str, tuple[dict | None, dict]] = {
    "2layer-gelu-tied:gpipe:4:encoder.block.1,lm_head": ({ENC_BIAS: [0, 1], "shared_embed_weight": [0, 1, 2]},
                                                         {1: [ENC_POSITION]}),
    # the encoder output goes to stages 1 and 2: relayed through stage 1; stage 2 recomputes the decoder's biases
    "2layer-gelu-tied:1f1b:4:decoder.embed,decoder.block.2": ({DEC_BIAS: [1, 2], "shared_embed_weight": [0, 1, 2]},
                                                              {2: [CROSS, DEC_POSITION]}),
    # stage 2 also rebuilds the decoder's causal mask from the decoder mask it receives anyway
    "3layer-relu-untied-2dec:1f1b:3:encoder.block.2,decoder.block.0": (
        {ENC_BIAS: [0, 1], "shared_embed_weight": [0, 1]}, {1: [ENC_POSITION], 2: ["decoder"]}),
    "3layer-relu-untied-2dec:gpipe:3:decoder.embed,decoder.final": ({"shared_embed_weight": [0, 1]}, {}),
    # two stages recompute the encoder's bias: stage 2's gradient returns to stage 1, whose sum returns to stage 0
    "3layer-relu-untied-2dec:1f1b:3:encoder.block.1,encoder.block.2": (
        {ENC_BIAS: [0, 1, 2], "shared_embed_weight": [0, 2]}, {1: [ENC_POSITION], 2: [ENC_POSITION]}),
    # and the same in the decoder, tied, GPipe
    "2layer-gelu-tied:gpipe:4:decoder.block.1,decoder.block.2": (
        {DEC_BIAS: [0, 1, 2], "shared_embed_weight": [0, 2]}, {1: [CROSS, DEC_POSITION], 2: [CROSS, DEC_POSITION]}),
    "2layer-gelu-tied:1f1b:3:optimal": (None, {}),  # the partitioner's own plan (nothing crosses to recompute)
    # DeepSpeed-style all-reduce of the copies: equal up to float rounding, replicas identical
    "2layer-gelu-tied:gpipe:3:encoder.final,decoder.block.1:allreduce": (
        {DEC_BIAS: [1, 2], "shared_embed_weight": [0, 1, 2]}, {2: [CROSS, DEC_POSITION]}),
}


# GPT2LMHeadModel: embed, transformer.h.N, final, lm_head; the embedding and the tied head share the weight.
GPT2_TWO_RANKS: dict[str, tuple[dict | None, dict]] = {
    "3layer-tied-relu-inner:gpipe:2:transformer.h.2": ({"shared_embed_weight": [0, 1]}, {}),
    "3layer-tied-relu-inner:1f1b:4:lm_head": ({"shared_embed_weight": [0, 1]}, {}),  # the head alone on stage 1
    "2layer-untied:1f1b:2:transformer.h.1": ({}, {}),  # untied: nothing shared across stages
}
GPT2_THREE_RANKS: dict[str, tuple[dict | None, dict]] = {
    "3layer-tied-relu-inner:gpipe:4:transformer.h.1,final": ({"shared_embed_weight": [0, 2]}, {}),
    "3layer-tied-relu-inner:1f1b:3:transformer.h.0,transformer.h.2": ({"shared_embed_weight": [0, 2]}, {}),
    "3layer-tied-relu-inner:1f1b:4:optimal": (None, {}),
    "3layer-tied-relu-inner:gpipe:3:transformer.h.1,transformer.h.2:allreduce": ({"shared_embed_weight": [0, 2]}, {}),
}
# BartForConditionalGeneration: encoder.embed, model.encoder.layers.N, decoder.embed, model.decoder.layers.N,
# lm_head; the shared embedding feeds both stacks and the tied head.
BART_TWO_RANKS: dict[str, tuple[dict | None, dict]] = {
    "2layer-scaled-3dec:gpipe:2:decoder.embed": ({"shared_embed_weight": [0, 1]}, {}),
    "2layer-scaled-3dec:gpipe:2:decoder.embed:send": ({"shared_embed_weight": [0, 1]}, {}),
    # both embeddings on stage 0, untied head on 1; stage 1 rebuilds the decoder's causal and cross-attention masks
    "2layer-untied:1f1b:2:model.decoder.layers.1": ({}, {1: ["model.decoder", "model.decoder"]}),
    "1layer-tied:1f1b:2:optimal": (None, {}),  # the partitioner's own plan
}
# BertForPreTraining: embeddings, bert.encoder.layer.N, pooler, cls (the tied MLM decoder with its own bias).
# Configurations whose every parameter gets a gradient (relative positions leave the absolute position table
# unused; cross-attention without encoder states its layers).
BERT_TWO_RANKS: dict[str, dict | None] = {
    "1layer-tied:gpipe:2:bert.encoder.layer.0": {"shared_embed_weight": [0, 1]},
    "1layer-tied:1f1b:4:cls": {"shared_embed_weight": [0, 1]},  # the heads alone on stage 1
    "2layer-untied-relu:1f1b:2:pooler": {},  # untied: nothing shared across stages
    "1layer-tied:gpipe:3:optimal": None,
}
# RobertaForMaskedLM: embeddings (position ids made from input_ids), roberta.encoder.layer.N, lm_head.
ROBERTA_TWO_RANKS: dict[str, dict | None] = {
    "1layer-tied:1f1b:2:roberta.encoder.layer.0": {"shared_embed_weight": [0, 1]},
    "1layer-tied:gpipe:4:lm_head": {"shared_embed_weight": [0, 1]},
    "2layer-untied-relu:gpipe:2:roberta.encoder.layer.1": {},
}
# The other families: nothing replayed (no position bias to recompute instead of send).
FAMILY_CASES = {("t5", 2): TWO_RANKS, ("t5", 3): THREE_RANKS, ("gpt2", 2): GPT2_TWO_RANKS,
                ("gpt2", 3): GPT2_THREE_RANKS, ("bart", 2): BART_TWO_RANKS,
                ("bert", 2): {case: (tied, {}) for case, tied in BERT_TWO_RANKS.items()},
                ("roberta", 2): {case: (tied, {}) for case, tied in ROBERTA_TWO_RANKS.items()}}


@pytest.mark.parametrize("family,ranks", list(FAMILY_CASES), ids=[f"{f}-{r}ranks" for f, r in FAMILY_CASES])
def test_gpipe_and_1f1b_equal_single_process_training(tmp_path: Path, family: str, ranks: int) -> None:
    cases = FAMILY_CASES[(family, ranks)]
    assert_equal_to_reference(launch(ranks, list(cases), tmp_path, family), cases)


def tiny_plan(split: list[str]) -> tuple[Any, Plan]:  # (config, plan)
    cfg = config("1layer-relu-tied")
    chain = family_chain(T5, "T5ForConditionalGeneration", cfg, MicroBatch(2, {"source": 7, "target": 5}))
    names = [block.name for block in chain.blocks]
    starts = [0] + [names.index(name) for name in split]
    return cfg, build_plan(chain.blocks, [(a, b - 1) for a, b in zip(starts, starts[1:] + [len(names)])],
                           Settings(), {}, values=chain.values)


def test_split_spec_cuts_before_each_later_stage_first_module() -> None:
    cfg, plan = tiny_plan(["decoder.embed", "lm_head"])
    built = T5.build("T5ForConditionalGeneration", cfg)
    assert isinstance(built, SharedWeight)
    model = built.make_stateless()
    assert list(split_spec(plan, model, "model.")) == ["model.decoder.embed_tokens", "model.lm_head"]
    encoder_only = T5.build("T5EncoderModel", cfg)
    with pytest.raises(UserError, match="'decoder.embed_tokens', which the model does not have"):
        split_spec(plan, encoder_only)


def test_pipeline_run_needs_torchrun() -> None:
    assert not dist.is_initialized()
    cfg, plan = tiny_plan(["decoder.embed"])
    with pytest.raises(UserError, match="launch with torchrun"):
        PipelineRun(T5.build("T5ForConditionalGeneration", cfg), plan, {}, micro_batches=2, schedule="gpipe")


# The --run path names no family: an encoder-decoder and a decoder-only model (every family's pipelined training
# equals one process above, and train-model's in test_train_model.py).
@pytest.mark.parametrize("family", ["t5", "gpt2"])
def test_partition_model_run_trains_the_plan_under_torchrun(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            family: str) -> None:
    from support.model_families import FAMILIES

    from partitioning.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(FAMILIES[family].make_config(FAMILIES[family].configs[0]).to_json_string())
    plan = tmp_path / "plan.json"
    lengths = [f"--{name}-len={length}" for name, length in FAMILIES[family].train_lengths.items()]
    code = main([family, "--version", "4.5.1", "--stages", "2", "--config", str(cfg), "--batch", "2", *lengths,
                 "--micro-batches", "2", "--output", str(plan), "--run", "--run-steps", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in steps] == ["step 1/2", "step 2/2"]
    assert all("over 2 micro-batches" in line for line in steps)
