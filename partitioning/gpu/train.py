"""A few pipelined training steps of a plan on synthetic data, one stage per rank (a torchrun entry point).

    torchrun --standalone --nproc-per-node K -m partitioning.gpu.train --plan plan.json [--steps 3] [--timeline FILE]

Uses NCCL and one GPU per rank when CUDA has enough devices, else gloo on
CPU.  The last stage prints each step's mean micro-batch loss and time.
``--timeline FILE``: rank 0 also writes every rank's timeline of every step
(:mod:`partitioning.gpu.timeline`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common.cli import Parser, positive_int, report
from common.errors import UserError
from families.definition import InputSpec
from families.family import trained_model
from families.models import MicroBatch, make_inputs
from partitioning.files import read_plan
from partitioning.gpu import timeline
from partitioning.gpu.pipelining import PipelineRun
from partitioning.plan import Plan
from partitioning.settings import TIED_SUMS, Settings

PROG = "partitioning.gpu.train"  # partitioning.gpu.launch finds a rank's error by it


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog=f"python -m {PROG}", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="plan JSON written by partition-model")
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate")
    parser.add_argument("--seed", type=int, default=0, help="same on every rank: the stages share one model")
    parser.add_argument("--tied-sum", choices=TIED_SUMS, default="ordered")
    parser.add_argument("--timeline", type=Path, metavar="FILE", help="write a per-rank timeline of every step")
    return parser


def device_for_rank() -> tuple[str, torch.device]:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))  # ranks on this machine
    if torch.cuda.is_available() and torch.cuda.device_count() >= world:
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def rebuild(described: dict) -> tuple[torch.nn.Module, Any, list[InputSpec], MicroBatch]:
    """The plan's model (same seed, same weights on every rank), its config, inputs and micro-batch.

    The plan records the generated package and the config class it was costed with; they must be
    what the family's recipe gives here (a stale plan, or one naming other code, is refused).
    """
    family, class_name, config, specs, micro_batch = trained_model(described)
    return family.build(class_name, config, "cpu"), config, specs, micro_batch


def train(plan: Plan, steps: int, lr: float, seed: int, tied_sum: str, device: torch.device,
          timeline_file: Path | None = None) -> list[str]:
    torch.manual_seed(seed)
    model, config, specs, micro_batch = rebuild(plan.model)
    settings = Settings.from_plan(plan.settings)
    micro_batches, schedule = settings.micro_batches, settings.schedule
    example = make_inputs(specs, config, micro_batch, "cpu")
    run = PipelineRun(model, plan, example, micro_batches=micro_batches, schedule=schedule, device=device,
                      tied_sum=tied_sum)
    optimizer = torch.optim.Adam(run.module.parameters(), lr=lr)
    whole = micro_batch.scaled(micro_batches)
    recorder = timeline.attach(run) if timeline_file is not None else None
    lines = []
    for step in range(steps):
        batch = {k: v.to(device) for k, v in make_inputs(specs, config, whole, "cpu", seed=seed + step + 1).items()}
        with timeline.step_of(recorder):
            start = time.perf_counter()
            losses = run.step(batch)
            with timeline.span_of(recorder, "optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            seconds = time.perf_counter() - start
        if losses:
            mean = torch.stack([loss.detach() for loss in losses]).mean().item()
            lines.append(f"step {step + 1}/{steps}: loss {mean:.4f} over {len(losses)} micro-batches, {seconds:.2f} s")
    if recorder is not None and timeline_file is not None:
        events = timeline.gather(recorder)
        if events is not None:
            timeline.write(timeline_file, events, schedule=schedule, micro_batches=micro_batches,
                           ranks=run.stages, placement=list(plan.ranks))
    return lines


def main(argv: list[str] | None = None) -> int:
    # Not common.cli.run: a rank keeps the default SIGTERM, so one blocked in a collective dies when torchrun stops it.
    rank = f"{PROG} (rank {os.environ.get('RANK', '0')})"
    try:
        args = _parser().parse_args(argv)
    except UserError as exc:
        return report(rank, exc)
    backend, device = device_for_rank()
    dist.init_process_group(backend)
    try:
        plan = read_plan(args.plan)
        for line in train(plan, args.steps, args.lr, args.seed, args.tied_sum, device, args.timeline):
            print(line, flush=True)
    except (UserError, OSError) as exc:
        return report(rank, exc)
    except Exception as exc:  # noqa: BLE001 (anything else: its traceback in the rank's log, then one line for launch)
        traceback.print_exc()
        print(f"{rank}: error: {_cause(exc)}", file=sys.stderr, flush=True)
        return 1
    finally:
        dist.destroy_process_group()
    return 0


def _cause(exc: BaseException) -> str:
    """The innermost exception that ``exc`` was raised from (the pipelining engine wraps a stage's), in one line."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = f"{type(root).__name__}: {' '.join(str(root).split())[:300] or '(no message)'}"
    return text if root is exc else f"{text} (raised as {type(exc).__name__}: {' '.join(str(exc).split())[:80]})"


if __name__ == "__main__":
    sys.exit(main())
