"""A few pipelined training steps of a plan on synthetic data, one stage per rank (a torchrun entry point).

    torchrun --standalone --nproc-per-node K -m partitioning.train --plan plan.json [--steps 3]

Uses NCCL and one GPU per rank when CUDA has enough devices, else gloo on
CPU.  The last stage prints each step's mean micro-batch loss and time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from partitioning.blocks import MicroBatch, build_t5, t5_inputs
from partitioning.pipelining import TIED_SUMS, PipelineRun, t5_loss
from partitioning.plan import Plan, PlanError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m partitioning.train", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="plan JSON written by partition-model")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-4, help="Adam learning rate")
    parser.add_argument("--seed", type=int, default=0, help="same on every rank: the stages share one model")
    parser.add_argument("--tied-sum", choices=TIED_SUMS, default="ordered")
    return parser


def _device() -> tuple[str, torch.device]:
    local_rank, world = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.is_available() and torch.cuda.device_count() >= world:
        torch.cuda.set_device(local_rank)
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def train(plan: Plan, steps: int, lr: float, seed: int, tied_sum: str, device: torch.device) -> list[str]:
    described = plan.model
    if described.get("family") != "t5" or described.get("class") != "T5ForConditionalGeneration":
        raise PlanError("training runs need a T5ForConditionalGeneration plan (its forward computes a loss)")
    from transformers import T5Config  # the plan stores the config the model was costed with

    config = T5Config(**described["config"])
    micro_batch = MicroBatch(**described["micro_batch"])
    micro_batches, schedule = int(plan.settings["micro_batches"]), str(plan.settings["schedule"])
    torch.manual_seed(seed)
    model = build_t5("T5ForConditionalGeneration", config, described["version"], device="cpu")
    example = t5_inputs("T5ForConditionalGeneration", config, micro_batch, "cpu")
    example.pop("labels")
    run = PipelineRun(model, plan, example, micro_batches=micro_batches, schedule=schedule, loss_fn=t5_loss,
                      device=device, tied_sum=tied_sum)
    optimizer = torch.optim.Adam(run.module.parameters(), lr=lr)
    whole = MicroBatch(micro_batch.batch * micro_batches, micro_batch.source_len, micro_batch.target_len)
    lines = []
    for step in range(steps):
        batch = {k: v.to(device) for k, v in t5_inputs("T5ForConditionalGeneration", config, whole, "cpu",
                                                       seed=seed + step + 1).items()}
        labels = batch.pop("labels")
        start = time.perf_counter()
        losses = run.step(batch, labels)
        optimizer.step()
        optimizer.zero_grad()
        seconds = time.perf_counter() - start
        if losses:
            mean = torch.stack([loss.detach() for loss in losses]).mean().item()
            lines.append(f"step {step + 1}/{steps}: loss {mean:.4f} over {len(losses)} micro-batches, {seconds:.2f} s")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    backend, device = _device()
    dist.init_process_group(backend)
    try:
        plan = Plan.from_json(args.plan.read_text())
        for line in train(plan, args.steps, args.lr, args.seed, args.tied_sum, device):
            print(line, flush=True)
    except (PlanError, OSError) as exc:
        print(f"partitioning.train: error (rank {dist.get_rank()}): {exc}", file=sys.stderr)
        return 2
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
