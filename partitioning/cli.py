"""``partition-model``: cost a generated model's block chain and split it into pipeline stages."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from converter.atomic import write_atomic
from partitioning import granularity as grain
from partitioning.calibration import Calibration, calibrate, clock
from partitioning.costing import Chain
from partitioning.family import ModelFamily, definitions
from partitioning.ipu.cli import add_ipu_arguments, run_ipu
from partitioning.partition import SCHEDULES, Settings, partition
from partitioning.placement import module_to_device
from partitioning.plan import Plan, PlanError
from partitioning.report import format_plan, report_error


def _length(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not (sep and name and value.isdigit()):
        raise argparse.ArgumentTypeError(f"expected NAME=N (a sequence length of the family), got {text!r}")
    return name, int(value)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="partition-model",
                                     description="Split a generated model into balanced pipeline stages.")
    families = definitions()
    parser.add_argument("family", help=f"model family (known: {', '.join(sorted(families))})")
    parser.add_argument("--version", required=True, help="transformers release the model was generated from")
    parser.add_argument("--stages", type=int, help="number of pipeline stages K (with --target ipu: --ipus)")
    parser.add_argument("--target", choices=("gpu", "ipu"), default="gpu",
                        help="gpu: torch.distributed.pipelining (CPU ranks work too); ipu: PopTorch placement")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--shape", help="a named shape of the family (its recipe's [shapes]; default: its default)")
    size.add_argument("--config", type=Path, help="a HuggingFace config.json giving the shape")
    parser.add_argument("--class", dest="class_name", help="model class (default: the family's default class)")
    parser.add_argument("--granularity", default=grain.AUTO,
                        help="blocks: N layers each, 'sublayer' (the family's sub-layers, cutting inside layers), "
                             "or 'auto' (default: plan both, keep the better; --target ipu: 1)")
    batch = parser.add_argument_group("micro-batch and schedule")
    batch.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    batch.add_argument("--seq-len", type=_length, action="append", default=[], metavar="NAME=N",
                       help="length of the family's sequence NAME (repeatable; default: the family's)")
    # The same as flags: --NAME-len N for every sequence length some family names.
    for name in sorted({length for family in families.values() for length in family.lengths}):
        batch.add_argument(f"--{name}-len", type=int, dest=f"length_{name}", metavar="N",
                           help=f"= --seq-len {name}=N")
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
    machine.add_argument("--memory-bandwidth", type=float, default=2000.0,
                         help="GB/s of device memory, for the cost of recomputing a value (default 2000)")
    machine.add_argument("--no-recompute", action="store_true",
                         help="send every value crossing a cut (default: recompute those cheaper to recompute)")
    machine.add_argument("--calibration", type=Path, metavar="FILE",
                         help="plan from a calibration written by --calibrate (times, FLOP/s, bandwidths)")
    machine.add_argument("--calibrate", type=Path, metavar="FILE",
                         help="measure this machine on --device (block times, FLOP/s, memory and link bandwidth) "
                              "for this model and micro-batch, write FILE and stop")
    machine.add_argument("--threads", type=int, default=1,
                         help="with --calibrate on CPU: intra-op threads, as each pipeline rank runs (default 1)")
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
        reported: list[str] = []  # a rank's own one-line error says more than torchrun's summary after it
        for line in child.stdout:
            if line.startswith("step "):
                print(line.rstrip(), flush=True)
            if line.startswith("partitioning.train: error"):
                reported.append(line.rstrip())
            tail = (tail + [line.rstrip()])[-20:]
    if child.returncode:
        errors = reported or [line for line in tail if "error" in line.lower()]
        raise PlanError(f"the pipelined run failed (torchrun exit {child.returncode}): "
                        f"{errors[-1] if errors else tail[-1] if tail else 'no output'}")


def _lengths(args: argparse.Namespace) -> dict[str, int]:
    lengths: dict[str, int] = {}
    flags = [(name.removeprefix("length_"), value) for name, value in vars(args).items()
             if name.startswith("length_") and value is not None]
    for name, value in [*args.seq_len, *flags]:
        if lengths.get(name, value) != value:
            raise PlanError(f"sequence length {name!r} given twice: {lengths[name]} and {value}")
        lengths[name] = value
    return lengths


def _plan(args: argparse.Namespace) -> tuple[str, Plan]:
    family = ModelFamily.load(args.family, args.version)
    class_name = args.class_name or family.definition.default_class
    info = family.class_info(class_name)
    if args.target == "ipu":
        if args.stages is not None and args.ipus is not None and args.stages != args.ipus:
            raise PlanError(f"--stages {args.stages} and --ipus {args.ipus} disagree: one stage per IPU")
        args.stages = args.ipus if args.ipus is not None else args.stages
    if args.stages is None:
        raise PlanError("--stages K is required (or --target ipu --ipus N)")
    if args.stages < 1:  # before costing, which can take seconds for large shapes
        raise PlanError(f"the number of stages must be at least 1, got {args.stages}")
    if args.run and not info.trains:
        trainers = family.training_classes()
        raise PlanError(f"--run trains, so it needs {' or '.join(trainers) or 'a class that computes a loss'} "
                        f"(a class whose forward returns its loss); {class_name} returns its {info.output}")
    if args.measure and args.device == "meta":
        raise PlanError("--measure needs a real --device (cpu or cuda)")
    if args.measure and args.calibration:
        raise PlanError("give --measure (time blocks now) or --calibration (times measured before), not both")
    granularity = grain.parse(args.granularity)
    if args.target == "ipu" and granularity == grain.AUTO:
        granularity = 1  # IPU placement works on whole layers
    calibration = _calibration(args.calibration) if args.calibration else None
    config = family.config(args.shape, args.config)
    micro_batch = family.micro_batch(args.batch, _lengths(args))
    settings = Settings(device_flops=args.device_flops * 1e12, bandwidth=args.bandwidth * 1e9,
                        memory_limit=args.memory_gb * 1e9 if args.memory_gb is not None else None,
                        micro_batches=args.micro_batches, schedule=args.schedule,
                        optimizer_states=args.optimizer_states, master_weights=args.master_weights,
                        measured=bool(args.measure), memory_bandwidth=args.memory_bandwidth * 1e9,
                        # PopTorch placement runs the model as traced: a value crossing IPUs is sent
                        recompute=not args.no_recompute and args.target != "ipu")
    if calibration is not None:
        settings = calibration.settings(settings)
    model = family.build(class_name, config, args.device)
    sublayers = granularity in (grain.AUTO, grain.SUBLAYER)
    chain = family.chain(class_name, config, micro_batch, granularity if isinstance(granularity, int) else 1,
                         args.device, args.measure, model=model, sublayers=sublayers)
    shape = args.shape or (str(args.config) if args.config else family.definition.default_shape)
    layer_lists = family.layer_lists(class_name)
    if calibration is not None:
        chain = calibration.apply(chain, layer_lists, family.describe(class_name, config, micro_batch, shape, 1))

    def plan_of(candidate: Chain, chosen: str | int) -> Plan:
        description = {**family.describe(class_name, config, micro_batch, shape, chosen),
                       "shared_bytes": candidate.shared_bytes}
        return partition(candidate.blocks, args.stages, settings, description, candidate.values)

    if granularity == grain.AUTO:
        plan, chain = grain.choose(chain, layer_lists, plan_of)
    else:
        plan = plan_of(chain, granularity)
    report = [f"{args.family} {args.version} {class_name} {shape}: {len(chain.blocks)} blocks "
              f"(granularity {plan.model['granularity']}), micro-batch {micro_batch.describe()}, "
              f"{args.micro_batches} micro-batches, {args.schedule}"
              + (f", calibrated on {calibration.device}" if calibration is not None else ""),
              format_plan(plan)]

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


def _calibration(path: Path) -> Calibration:
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanError(f"cannot read calibration {path}: {exc.strerror}") from None
    return Calibration.from_json(text, str(path))


def _calibrate(args: argparse.Namespace) -> str:
    """Measure this machine for the model and micro-batch the arguments describe; write the calibration."""
    family = ModelFamily.load(args.family, args.version)
    class_name = args.class_name or family.definition.default_class
    if not family.class_info(class_name).trains:
        raise PlanError(f"--calibrate times training steps: it needs a class that computes its loss, "
                        f"not {class_name}")
    if args.device == "meta":
        raise PlanError("--calibrate needs a real --device (cpu or cuda)")
    if args.threads < 1:
        raise PlanError(f"--threads must be at least 1, got {args.threads}")
    if not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    config = family.config(args.shape, args.config)
    micro_batch = family.micro_batch(args.batch, _lengths(args))
    shape = args.shape or (str(args.config) if args.config else family.definition.default_shape)
    torch.manual_seed(0)
    model = family.build(class_name, config, args.device)
    repeats = args.measure or 5
    chain = family.chain(class_name, config, micro_batch, 1, args.device, repeats, model=model, sublayers=True,
                         clock=clock(args.device))
    inputs = family.inputs(class_name, config, micro_batch, args.device)
    described = family.describe(class_name, config, micro_batch, shape, grain.SUBLAYER)
    result = calibrate(chain, model, inputs, described, repeats, args.threads)
    write_atomic(args.calibrate, result.to_json().encode())
    return (f"calibrated {args.family} {args.version} {class_name} {shape}, micro-batch {micro_batch.describe()} "
            f"on {result.device} ({args.threads} thread(s)): {result.flops / 1e9:.3g} GFLOP/s, backward "
            f"{result.backward_factor:.2f}x forward, memory {result.memory_bandwidth / 1e9:.3g} GB/s, "
            f"{result.backend} link {result.bandwidth / 1e9:.3g} GB/s\nwrote {args.calibrate}")


def main(argv: list[str] | None = None) -> int:
    try:
        parser = _parser()  # its flags come from the families' data
    except PlanError as exc:
        return report_error(exc)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed its one-line usage error
        return 0 if exc.code == 0 else 2
    try:
        if args.target == "ipu" and args.ipu_plan is not None:
            return run_ipu(args)
        if args.calibrate is not None:
            print(_calibrate(args), flush=True)
            return 0
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
