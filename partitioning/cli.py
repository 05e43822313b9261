"""``partition-model``: cost a generated model's block chain and split it into pipeline stages."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from converter.atomic import write_atomic
from partitioning.blocks import CLASSES, MicroBatch, build_t5, t5_chain
from partitioning.ipu.cli import add_ipu_arguments, run_ipu
from partitioning.partition import SCHEDULES, Settings, partition
from partitioning.placement import module_to_device
from partitioning.plan import Plan, PlanError
from partitioning.report import format_plan, report_error
from partitioning.shapes import SHAPES, t5_config

FAMILIES = ("t5",)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="partition-model",
                                     description="Split a generated model into balanced pipeline stages.")
    parser.add_argument("family", help="model family (known: t5)")
    parser.add_argument("--version", required=True, help="transformers release the model was generated from")
    parser.add_argument("--stages", type=int, help="number of pipeline stages K (with --target ipu: --ipus)")
    parser.add_argument("--target", choices=("gpu", "ipu"), default="gpu",
                        help="gpu: torch.distributed.pipelining (CPU ranks work too); ipu: PopTorch placement")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--shape", help=f"named shape ({', '.join(SHAPES)}; default t5-small)")
    size.add_argument("--config", type=Path, help="a HuggingFace config.json giving the shape")
    parser.add_argument("--class", dest="class_name", default="T5ForConditionalGeneration",
                        help=f"model class ({', '.join(CLASSES)})")
    parser.add_argument("--granularity", type=int, default=1, help="transformer layers per block (default 1)")
    batch = parser.add_argument_group("micro-batch and schedule")
    batch.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    batch.add_argument("--source-len", type=int, default=512)
    batch.add_argument("--target-len", type=int, default=128)
    batch.add_argument("--micro-batches", type=int, default=8)
    batch.add_argument("--schedule", default="1f1b", help=f"pipeline schedule ({', '.join(SCHEDULES)})")
    machine = parser.add_argument_group("machine")
    machine.add_argument("--device-flops", type=float, default=100.0, help="sustained TFLOP/s per device")
    machine.add_argument("--bandwidth", type=float, default=25.0, help="GB/s between neighbouring stages")
    machine.add_argument("--memory-gb", type=float, help="memory per device in GB (default: unlimited)")
    machine.add_argument("--optimizer-states", type=int, default=2,
                         help="optimizer copies of each parameter (Adam: 2, SGD with momentum: 1)")
    machine.add_argument("--master-weights", action="store_true", help="mixed precision: count an fp32 master copy")
    machine.add_argument("--measure", type=int, metavar="REPEATS", default=0,
                         help="time each block on --device (median of REPEATS runs) and plan on that time")
    machine.add_argument("--device", default="meta", help="where to build the model for costing (default: meta)")
    out = parser.add_argument_group("output")
    out.add_argument("--output", type=Path, default=Path("plan.json"), help="plan JSON (default: plan.json)")
    out.add_argument("--plot", type=Path, help="PNG of per-stage time and memory")
    out.add_argument("--module-to-device", nargs="?", const="-", metavar="FILE",
                     help="also print (or write to FILE) the {module: 'cuda:i'} placement of the plan")
    run = parser.add_argument_group("pipelined run")
    run.add_argument("--run", action="store_true",
                     help="then train --run-steps steps of the plan on synthetic data under torchrun, one stage "
                          "per process (NCCL on GPUs when there are enough, else gloo on CPU)")
    run.add_argument("--run-steps", type=int, default=3)
    add_ipu_arguments(parser)
    return parser


def _launch(plan: Path, stages: int, steps: int) -> None:
    """torchrun the plan's stages, streaming what the last stage prints."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={stages}",
               "-m", "partitioning.train", "--plan", str(plan), "--steps", str(steps)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as child:
        assert child.stdout is not None
        tail: list[str] = []
        for line in child.stdout:
            if line.startswith("step "):
                print(line.rstrip(), flush=True)
            tail = (tail + [line.rstrip()])[-20:]
    if child.returncode:
        errors = [line for line in tail if "error" in line.lower()]
        raise PlanError(f"the pipelined run failed (torchrun exit {child.returncode}): "
                        f"{errors[-1] if errors else tail[-1] if tail else 'no output'}")


def _plan(args: argparse.Namespace) -> tuple[str, Plan]:
    if args.family not in FAMILIES:
        raise PlanError(f"unknown family {args.family!r}; known: {', '.join(FAMILIES)}")
    if args.target == "ipu":
        if args.stages is not None and args.ipus is not None and args.stages != args.ipus:
            raise PlanError(f"--stages {args.stages} and --ipus {args.ipus} disagree: one stage per IPU")
        args.stages = args.ipus if args.ipus is not None else args.stages
    if args.stages is None:
        raise PlanError("--stages K is required (or --target ipu --ipus N)")
    if args.stages < 1:  # before costing, which can take seconds for large shapes
        raise PlanError(f"the number of stages must be at least 1, got {args.stages}")
    if args.run and args.class_name != "T5ForConditionalGeneration":
        raise PlanError("--run trains, so it needs T5ForConditionalGeneration (the class that computes a loss)")
    if args.measure and args.device == "meta":
        raise PlanError("--measure needs a real --device (cpu or cuda)")
    config = t5_config(args.shape or (None if args.config else "t5-small"), args.config)
    micro_batch = MicroBatch(args.batch, args.source_len, args.target_len)
    settings = Settings(device_flops=args.device_flops * 1e12, bandwidth=args.bandwidth * 1e9,
                        memory_limit=args.memory_gb * 1e9 if args.memory_gb is not None else None,
                        micro_batches=args.micro_batches, schedule=args.schedule,
                        optimizer_states=args.optimizer_states, master_weights=args.master_weights,
                        measured=bool(args.measure))
    model = build_t5(args.class_name, config, args.version, args.device)
    chain = t5_chain(args.class_name, config, micro_batch, args.granularity, args.version, args.device,
                     args.measure, model=model)
    description = {"family": args.family, "version": args.version, "class": args.class_name,
                   "shape": args.shape or (str(args.config) if args.config else "t5-small"),
                   "config": config.to_dict(), "granularity": args.granularity,
                   "micro_batch": {"batch": args.batch, "source_len": args.source_len,
                                   "target_len": args.target_len}, "shared_bytes": chain.shared_bytes}
    plan = partition(chain.blocks, args.stages, settings, description)
    report = [f"{args.family} {args.version} {args.class_name} {description['shape']}: {len(chain.blocks)} blocks, "
              f"micro-batch {args.batch}x{args.source_len}->{args.target_len}, "
              f"{args.micro_batches} micro-batches, {args.schedule}", format_plan(plan)]

    write_atomic(args.output, plan.to_json().encode())
    report.append(f"wrote {args.output}")
    if args.plot:
        from partitioning.plot import plot_plan  # matplotlib is an optional extra

        plot_plan(plan, args.plot)
        report.append(f"wrote {args.plot}")
    if args.module_to_device:
        placement = json.dumps(module_to_device(plan, model=model), indent=2) + "\n"
        if args.module_to_device == "-":
            report.append(placement.rstrip())
        else:
            write_atomic(Path(args.module_to_device), placement.encode())
            report.append(f"wrote {args.module_to_device}")
    return "\n".join(report), plan


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return 0 if exc.code == 0 else 2
    try:
        if args.target == "ipu" and args.ipu_plan is not None:
            return run_ipu(args)
        report, plan = _plan(args)
        print(report, flush=True)
        if args.target == "ipu":
            return run_ipu(args, plan)
        if args.run:
            _launch(args.output, args.stages, args.run_steps)
    except (PlanError, OSError) as exc:
        return report_error(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
