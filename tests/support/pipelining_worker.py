"""One rank of the pipelining acceptance test (run under torchrun): pipeline vs single-process reference.

For every case named on the command line it trains the family's default class (tests/model_families.py)
3 steps both ways from the same weights and writes, per rank, the names of whatever differs (losses,
gradients, parameters, tied copies).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package
from families.models import MicroBatch, SharedWeight  # noqa: E402
from partitioning.cost.chain import family_chain  # noqa: E402
from partitioning.gpu.pipelining import PipelineRun  # noqa: E402
from partitioning.schedules import placement  # noqa: E402
from partitioning.solve.partition import Settings, build_plan, partition  # noqa: E402
from support.model_checks import Family  # noqa: E402
from support.train_runs import without_dropout  # noqa: E402

STEPS, PER_MICRO_BATCH = 3, 2


@functools.cache
def family_of(name: str) -> Family:
    """A 4.5.1 family of model_families.py, or NAME@RELEASE: an LLM, or a head family (support/heads.py), at the
    release this process imports."""
    if "@" in name:
        base, release = name.split("@")
        from support.heads import HEADS, head_family_at
        if base in HEADS:
            return head_family_at(base, release)
        from support.llm_pipelining import LLM
        return LLM(base, release)  # type: ignore[return-value]
    from support.model_families import FAMILIES
    return FAMILIES[name]


def run_case(family: Family, case: str, out: Path) -> None:
    config_name, schedule, chunks, split, *options = case.rpartition("/")[2].split(":")
    tied_sum = "allreduce" if "allreduce" in options else "ordered"
    micro_batches = int(chunks)
    # ordered: bit-equal to the reference; allreduce: equal up to the order of the float sum; reordered: the
    # schedule itself accumulates weight gradients in another micro-batch order (LoopedBFS runs its backwards
    # from the last micro-batch down), also equal up to the order of the float sum only
    exact = tied_sum == "ordered" and "reordered" not in options
    same = torch.equal if exact else lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    cfg = without_dropout(family.make_config(config_name))
    models = family.model_family
    class_name = models.definition.default_class
    torch.manual_seed(0)
    built = models.build(class_name, cfg, device="cpu")
    assert isinstance(built, SharedWeight), class_name  # every family these cases run shares a weight
    model = built.make_stateless()
    reference = copy.deepcopy(model)

    micro_batch = MicroBatch(PER_MICRO_BATCH, family.train_lengths)
    chain = family_chain(models, class_name, cfg, micro_batch, sublayers="sublayers" in options)  # blocks in layers
    # send: every crossing value is sent, as before recomputation existed
    settings = Settings(micro_batches=micro_batches, schedule=schedule, recompute="send" not in options)
    world, virtual = dist.get_world_size(), settings.virtual_stages or 1
    if split == "optimal":
        plan = partition(chain.blocks, world, settings, {}, chain.values)
    else:  # the names of the first blocks of stages (chunks) 1, 2, ...
        names = [block.name for block in chain.blocks]
        starts = [0] + [names.index(name) for name in split.split(",")]
        segments = [(start, end - 1) for start, end in zip(starts, starts[1:] + [len(names)])]
        plan = build_plan(chain.blocks, segments, settings, {}, values=chain.values)
        if virtual > 1:
            plan.placement = list(placement(schedule, world, virtual))

    assert family.train_batch is not None
    data = [family.train_batch(cfg, PER_MICRO_BATCH * micro_batches, 10 + step) for step in range(STEPS)]
    example = {k: v[:PER_MICRO_BATCH] for k, v in data[0].items()}  # labels too: the model computes its loss
    run = PipelineRun(model, plan, example, micro_batches=micro_batches, schedule=schedule, tied_sum=tied_sum)
    tied = {c.name.removeprefix("model."): c for c in run.tied}
    rank, last = dist.get_rank(), run.last
    local = [(chunk, name.removeprefix("model."), p) for chunk, module in zip(run.chunks, run.chunk_modules)
             for name, p in module.named_parameters()]
    # every name of a parameter: BERT's MLM decoder bias is its head's bias too, and a stage names it by its use
    reference_parameters = dict(reference.named_parameters(remove_duplicate=False))
    optimizer = torch.optim.Adam(run.module.parameters(), lr=1e-2, foreach=False)
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2, foreach=False)
    problems: list[str] = []
    for step, values in enumerate(data):
        losses = run.step(values)
        expected = []
        for chunk in range(micro_batches):
            part = {k: v.tensor_split(micro_batches)[chunk] for k, v in values.items()}
            loss = reference(**part)
            loss.backward()
            expected.append(loss.detach())
        for p in reference.parameters():
            assert p.grad is not None  # every parameter of the reference trains
            p.grad.div_(micro_batches)  # as the schedule scales gradients
        if last and not (len(losses) == micro_batches and all(same(a.detach(), b) for a, b in zip(losses, expected))):
            problems.append(f"step {step}: losses {losses} != {expected}")
        for chunk, name, p in local:
            expected_grad = reference_parameters[name].grad
            if p.grad is None or expected_grad is None or not same(p.grad, expected_grad):
                off = "" if p.grad is None or expected_grad is None else \
                    f": off by {(p.grad - expected_grad).abs().max().item():.3g}, " \
                    f"largest {expected_grad.abs().max().item():.3g}"
                problems.append(f"step {step}: gradient of {name} (chunk {chunk}){off}")
        optimizer.step(), reference_optimizer.step()
        optimizer.zero_grad(), reference_optimizer.zero_grad()
    for chunk, name, p in local:
        if not same(p, reference_parameters[name]):
            problems.append(f"after {STEPS} steps: {name} (chunk {chunk})")
    for name, copy_ in tied.items():  # every replica of a tied weight is the same tensor
        replicas = [torch.empty_like(copy_.parameter) for _ in copy_.stages]
        dist.all_gather(replicas, copy_.parameter.detach(), group=copy_.group)
        if not all(torch.equal(replica, replicas[0]) for replica in replicas):
            problems.append(f"after {STEPS} steps: replicas of {name} differ")
    held: dict[str, list[int]] = {}
    for copy_ in run.tied:
        held.setdefault(copy_.name.removeprefix("model."), []).append(copy_.chunk)
    record = {"case": case, "rank": rank, "problems": problems, "parameters": sorted(name for _, name, _ in local),
              "tied": held, "chunks": run.chunks, "kept": [[c.most_held, c.uses] for c in run.tied],
              "replayed": {c: run.recomputation.replayed.get(c, []) for c in run.chunks},
              "planned": {c: sorted(plan.stages[c].recompute) for c in run.chunks},
              "received": [list(n.meta["val"].shape) for module in run.chunk_modules for n in module.graph.nodes
                           if n.op == "placeholder"]}
    file = "".join("_" if c in ":/@" else "+" if c == "," else c for c in case)
    (out / f"{family.name}_{file}.rank{rank}.json").write_text(json.dumps(record))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--family", default="t5", help="a family of model_families.py, or an LLM or a head (support/heads.py) as NAME@RELEASE")
    parser.add_argument("cases", nargs="+",
                        help="[NAME@RELEASE/]config:schedule:micro-batches:split[:allreduce][:send][:reordered], "
                             "split = 'optimal' or the comma-separated first blocks of stages (chunks) 1, 2, ...; "
                             "send: plan without recomputation; an LLM or head prefix runs that family instead of "
                             "--family (one launch, several families of the release this process imports)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    try:
        for case in args.cases:
            run_case(family_of(case.rpartition("/")[0] or args.family), case, args.out)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
