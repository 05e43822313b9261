"""train-model with several chunks per rank (V = 2 on 2 ranks) equals one process.

GPT-2 (the tied wte / lm_head), 4 chunks: a looped schedule (interleaved1f1b, chunks on ranks [0, 1, 0, 1])
and a V-shaped one (zbvzerobubble, [0, 1, 1, 0]: rank 0 holds both the embedding's and the head's chunk, so
both copies of the tied weight live on one rank).  3 AdamW steps with warm-up, clipping and weight decay, one
torchrun launch for both; the saved weights are torch.equal to the same steps in one process.

With 2 replicas (4 ranks, interleaved1f1b, a DDP per chunk): equal to one process on the whole batch up to
the summation order of DDP's all-reduce (one process adds the micro-batches one by one, DDP each replica's
sum), the bound of tests/partitioning/test_train_dp.py tested.
"""

from __future__ import annotations

from pathlib import Path

from support.model_families import FAMILIES
from test_train_dp import BOUND
from test_train_model import (
    OPTIONS,
    PER_MICRO_BATCH,
    STEPS,
    assert_saved_equals,
    launch,
    reference,
    save_checkpoint,
    saved_differences,
    write_data,
)

from families.models import MicroBatch
from partitioning.cost.chain import family_chain
from partitioning.schedules import placement
from partitioning.solve.partition import Settings, build_plan

MICRO_BATCHES = 4
SPLIT = ["transformer.h.1", "transformer.h.2", "lm_head"]  # the first blocks of chunks 1..3


def write_chunk_plan(cfg: object, schedule: str, path: Path) -> None:
    models = FAMILIES["gpt2"].model_family
    class_name = models.definition.default_class
    micro_batch = MicroBatch(PER_MICRO_BATCH, FAMILIES["gpt2"].train_lengths)
    chain = family_chain(models, class_name, cfg, micro_batch)
    names = [block.name for block in chain.blocks]
    starts = [0] + [names.index(name) for name in SPLIT]
    plan = build_plan(chain.blocks, [(a, b - 1) for a, b in zip(starts, starts[1:] + [len(names)])],
                      Settings(micro_batches=MICRO_BATCHES, schedule=schedule, virtual_stages=2), {},
                      values=chain.values)
    plan.placement = list(placement(schedule, 2, 2))
    plan.model = models.describe(class_name, cfg, micro_batch, "test", 1)
    path.write_text(plan.to_json())


def test_two_chunks_per_rank_equal_one_process(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    cfg = save_checkpoint("gpt2", checkpoint)
    cases, plans = {}, {}
    for schedule in ("interleaved1f1b", "zbvzerobubble"):
        plan, data = tmp_path / f"{schedule}.json", tmp_path / f"{schedule}.jsonl"
        write_chunk_plan(cfg, schedule, plan)
        write_data(data, plan, count=13)
        plans[schedule] = (plan, data)
        cases[schedule] = ["--plan", str(plan), "--checkpoint", str(checkpoint), "--data", str(data), "--steps",
                           str(STEPS), "--save", str(tmp_path / f"{schedule}.out"), *OPTIONS]
    records = launch(2, cases, tmp_path / "records")
    for schedule, (plan, data) in plans.items():
        assert {record["rank"] for record in records[schedule]} == {0, 1}
        assert_saved_equals("gpt2", tmp_path / f"{schedule}.out",
                            reference("gpt2", checkpoint, plan, data, STEPS, MICRO_BATCHES))


def test_two_replicas_of_two_chunks_per_rank(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    cfg = save_checkpoint("gpt2", checkpoint)
    plan, data = tmp_path / "plan.json", tmp_path / "data.jsonl"
    write_chunk_plan(cfg, "interleaved1f1b", plan)
    write_data(data, plan, count=21)
    records = launch(4, {"dp": ["--plan", str(plan), "--checkpoint", str(checkpoint), "--data", str(data), "--steps",
                                str(STEPS), "--save", str(tmp_path / "out"), "--data-parallel", "2", *OPTIONS]},
                     tmp_path / "records")
    assert sorted((r["replica"], r["rank"]) for r in records["dp"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    different = saved_differences("gpt2", tmp_path / "out", reference("gpt2", checkpoint, plan, data, STEPS,
                                                                      2 * MICRO_BATCHES))
    assert max(different.values(), default=0.0) < BOUND, different
