"""``partition-model``: cost a generated model's block chain and split it into pipeline stages."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from common.errors import Interrupted, terminate_as_interrupt
from partitioning.cost import granularity as grain
from partitioning.arguments import Parser, count, positive_int, positive_number
from partitioning.cost.calibration import Calibration, calibrate, clock
from partitioning.cost.costing import Chain
from families.family import ModelFamily, definitions
from common.files import read_text
from partitioning.files import check_destinations, write_outputs
from partitioning.ipu.cli import add_ipu_arguments, ipu_config, ipu_destinations, ipu_outputs, run_ipu
from partitioning.solve.partition import SCHEDULES, Settings, partition
from partitioning.gpu.module_to_device import module_to_device
from partitioning.plan import Plan
from common.errors import UserError
from partitioning.solve.report import format_plan, report_error
from partitioning.cost.chain import family_chain

MAX_CALIBRATION_BYTES = 16 << 20
DEFAULT_BATCH = 8  # sequences per micro-batch of a GPU plan; an IPU plan's default is the family's [ipu] one


def _length(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not (sep and name and value.isdigit() and int(value) > 0):  # a length of 0 is no sequence
        raise argparse.ArgumentTypeError(f"expected NAME=N (a sequence length of the family), got {text!r}")
    return name, int(value)


def _granularity(text: str) -> str | int:
    try:
        return grain.parse(text)
    except UserError:
        raise argparse.ArgumentTypeError(f"expected 'auto', 'sublayer' or a positive number of layers per block, "
                                         f"got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="partition-model", description="Split a generated model into balanced pipeline stages.")
    families = definitions()
    parser.add_argument("family", help=f"model family (known: {', '.join(sorted(families))})")
    parser.add_argument("--version", required=True, help="transformers release the model was generated from")
    parser.add_argument("--stages", type=positive_int, help="number of pipeline stages K (with --target ipu: --ipus)")
    parser.add_argument("--target", choices=("gpu", "ipu"), default="gpu",
                        help="gpu: torch.distributed.pipelining (CPU ranks work too); ipu: PopTorch placement")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--shape", help="a named shape of the family (its recipe's [shapes]; default: its default)")
    size.add_argument("--config", type=Path, help="a HuggingFace config.json giving the shape")
    parser.add_argument("--class", dest="class_name", help="model class (default: the family's default class)")
    parser.add_argument("--granularity", type=_granularity, default=grain.AUTO,
                        help="blocks: N layers each, 'sublayer' (the family's sub-layers, cutting inside layers), "
                             "or 'auto' (default: plan both, keep the better; --target ipu: 1)")
    batch = parser.add_argument_group("micro-batch and schedule")
    batch.add_argument("--batch", type=positive_int,
                       help=f"sequences per micro-batch (default {DEFAULT_BATCH}; --target ipu: the family's [ipu])")
    batch.add_argument("--seq-len", type=_length, action="append", default=[], metavar="NAME=N",
                       help="length of the family's sequence NAME (repeatable; default: the family's)")
    # The same as flags: --NAME-len N for every sequence length some family names.
    for name in sorted({length for family in families.values() for length in family.lengths}):
        batch.add_argument(f"--{name}-len", type=positive_int, dest=f"length_{name}", metavar="N",
                           help=f"= --seq-len {name}=N")
    batch.add_argument("--micro-batches", type=positive_int, default=8)
    batch.add_argument("--schedule", default="1f1b", help=f"pipeline schedule ({', '.join(SCHEDULES)})")
    machine = parser.add_argument_group("machine")
    machine.add_argument("--device-flops", type=positive_number, default=100.0, help="sustained TFLOP/s per device")
    machine.add_argument("--bandwidth", type=positive_number, default=25.0, help="GB/s between neighbouring stages")
    machine.add_argument("--memory-gb", type=positive_number, help="memory per device in GB (default: unlimited)")
    machine.add_argument("--optimizer-states", type=count, default=2,
                         help="optimizer copies of each parameter (Adam: 2, SGD with momentum: 1)")
    machine.add_argument("--master-weights", action="store_true", help="mixed precision: count an fp32 master copy")
    machine.add_argument("--measure", type=count, metavar="REPEATS", default=0,
                         help="time each block on --device (median of REPEATS runs) and plan on that time")
    machine.add_argument("--device", default="meta", help="where to build the model for costing (default: meta)")
    machine.add_argument("--memory-bandwidth", type=positive_number, default=2000.0,
                         help="GB/s of device memory, for the cost of recomputing a value (default 2000)")
    machine.add_argument("--no-recompute", action="store_true",
                         help="send every value crossing a cut (default: recompute those cheaper to recompute)")
    machine.add_argument("--calibration", type=Path, metavar="FILE",
                         help="plan from a calibration written by --calibrate (times, FLOP/s, bandwidths)")
    machine.add_argument("--calibrate", type=Path, metavar="FILE",
                         help="measure this machine on --device (block times, FLOP/s, memory and link bandwidth) "
                              "for this model and micro-batch, write FILE and stop")
    machine.add_argument("--threads", type=positive_int, default=1,
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
    run.add_argument("--run-steps", type=positive_int, default=3)
    add_ipu_arguments(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="tracebacks of internal errors")
    return parser


def _launch(plan: Path, stages: int, steps: int) -> None:
    """torchrun the plan's stages, streaming what the last stage prints; a failure is one line.

    torchrun runs in its own session, so an interrupt here (Ctrl-C, SIGTERM)
    stops it and every rank before partition-model exits.
    """
    # torchrun keeps its logs (and the ranks their temporaries) in a directory it never removes: give it one of ours.
    with tempfile.TemporaryDirectory(prefix="partition-model-run-") as scratch:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={stages}",
                   "--log-dir", scratch, "-m", "partitioning.gpu.train", "--plan", str(plan), "--steps", str(steps)]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TMPDIR": scratch}
        _torchrun(command, env)


def _torchrun(command: list[str], env: dict[str, str]) -> None:
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             start_new_session=True)
    tail: list[str] = []
    reported: list[str] = []  # a rank's own one-line error says more than torchrun's summary after it
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith("step "):
                print(line.rstrip(), flush=True)
            if line.startswith("partitioning.gpu.train: error"):
                reported.append(line.rstrip())
            tail = (tail + [line.rstrip()])[-40:]
        child.wait()
    finally:
        if child.poll() is None:  # interrupted: stop torchrun and the ranks it started
            _stop(child)
        if child.stdout is not None:
            child.stdout.close()
    if child.returncode:
        raise UserError(f"the pipelined run failed (torchrun exit {child.returncode}): "
                        f"{reported[-1] if reported else _failure(tail)}")


def _stop(child: subprocess.Popen[str]) -> None:
    for signum, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(child.pid, signum)  # torchrun's own session: it and the ranks it started
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _failure(tail: list[str]) -> str:
    """The line of torchrun's output that says why a rank failed (its summary names the rank and the cause)."""
    roots = [i for i, line in enumerate(tail) if line.startswith("Root Cause")]
    tail = tail[roots[-1]:] if roots else tail  # the first failure, not the ranks torchrun stopped because of it
    rank = next((line.split(":", 1)[1].strip() for line in tail if line.strip().startswith("rank ")), None)
    cause = next((line.split(":", 1)[1].strip() for line in tail if line.strip().startswith("traceback ")), None)
    if cause and "To enable traceback" not in cause:
        return f"rank {rank}: {cause}" if rank else cause
    code = next((line.split(":", 1)[1].strip() for line in tail if line.strip().startswith("exitcode ")), None)
    if code:
        return f"rank {rank} exited with code {code}" if rank else f"a rank exited with code {code}"
    errors = [line for line in tail if "error" in line.lower()]
    return errors[-1] if errors else tail[-1] if tail else "no output"


def _lengths(args: argparse.Namespace) -> dict[str, int]:
    lengths: dict[str, int] = {}
    flags = [(name.removeprefix("length_"), value) for name, value in vars(args).items()
             if name.startswith("length_") and value is not None]
    for name, value in [*args.seq_len, *flags]:
        if lengths.get(name, value) != value:
            raise UserError(f"sequence length {name!r} given twice: {lengths[name]} and {value}")
        lengths[name] = value
    return lengths


def _destinations(args: argparse.Namespace) -> dict[str, Path]:
    """Every file this command writes, by the flag that names it."""
    paths = {"--output": args.output}
    if args.plot:
        paths["--plot"] = args.plot
    if args.module_to_device not in (None, "-"):
        paths["--module-to-device"] = Path(args.module_to_device)
    if args.target == "ipu":
        paths.update(ipu_destinations(args))
    return paths


def _inputs(args: argparse.Namespace) -> dict[str, Path | None]:
    """Every file this command reads, by the flag that names it."""
    return {"--config": args.config, "--calibration": args.calibration, "--ipu-config": args.ipu_config,
            "--ipu-plan": args.ipu_plan}


def _check_device(name: str) -> None:
    """``--device`` names a device torch can allocate on here (meta always can)."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(f"--device {name!r} is not a torch device (e.g. cpu, cuda, cuda:1, meta)") from None
    if device.type == "meta":
        return
    try:
        torch.empty(1, device=device)
    except Exception as exc:  # noqa: BLE001 (each backend fails its own way: AssertionError, RuntimeError...)
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"--device {name}: cannot allocate there ({reason})") from None


def _validate(args: argparse.Namespace, family: ModelFamily) -> Any:
    """Everything that can be checked before the slow costing, in the order a user would fix it.

    Returns the IPU config for ``--target ipu`` (None otherwise) and settles
    ``args.stages`` and ``args.batch``.
    """
    info = family.class_info(args.class_name or family.definition.default_class)
    config = None
    if args.target == "ipu":
        if args.run:
            raise UserError("--run trains with torch.distributed.pipelining; for IPUs use the generated code and "
                            "options file on a machine with the Poplar SDK (drop --run or --target ipu)")
        if args.stages is not None and args.ipus is not None and args.stages != args.ipus:
            raise UserError(f"--stages {args.stages} and --ipus {args.ipus} disagree: one stage per IPU")
        config = ipu_config(args, family.definition)
        args.stages, args.batch = config.ipus_per_replica, config.micro_batch_size
    if args.stages is None:
        raise UserError("--stages K is required (or --target ipu --ipus N)")
    if args.batch is None:
        args.batch = DEFAULT_BATCH
    if args.run and not info.trains:
        trainers = family.training_classes()
        raise UserError(f"--run trains, so it needs {' or '.join(trainers) or 'a class that computes a loss'} "
                        f"(a class whose forward returns its loss); {info.name} returns its {info.output}")
    if args.run and args.schedule == "1f1b" and args.micro_batches < args.stages:
        raise UserError(f"--run with the 1f1b schedule needs micro-batches ({args.micro_batches}) >= stages "
                        f"({args.stages}): raise --micro-batches or use --schedule gpipe")
    if args.measure and args.device == "meta":
        raise UserError("--measure needs a real --device (cpu or cuda)")
    if args.measure and args.calibration:
        raise UserError("give --measure (time blocks now) or --calibration (times measured before), not both")
    if args.target == "ipu" and args.granularity == grain.AUTO:
        args.granularity = 1  # IPU placement works on whole layers
    _check_device(args.device)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise UserError("--plot needs matplotlib (pip install 'hf-pipeline-convert[plot]')")
    check_destinations(_destinations(args), _inputs(args))
    return config


def _plan(args: argparse.Namespace) -> tuple[list[str], dict[Path, bytes], Plan]:
    """The report lines, the files to write and the plan (nothing is written here)."""
    family = ModelFamily.load(args.family, args.version)
    config = _validate(args, family)
    calibration = _calibration(args.calibration) if args.calibration else None
    class_name = args.class_name or family.definition.default_class
    model_config = family.config(args.shape, args.config)
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
    granularity = args.granularity
    model = family.build(class_name, model_config, args.device)
    sublayers = granularity in (grain.AUTO, grain.SUBLAYER)
    chain = family_chain(family, class_name, model_config, micro_batch, granularity if isinstance(granularity, int) else 1,
                         args.device, args.measure, model=model, sublayers=sublayers)
    shape = args.shape or (str(args.config) if args.config else family.definition.default_shape)
    layer_lists = family.layer_lists(class_name)
    if calibration is not None:
        chain = calibration.apply(chain, layer_lists,
                                  family.describe(class_name, model_config, micro_batch, shape, 1))

    def plan_of(candidate: Chain, chosen: str | int) -> Plan:
        description = {**family.describe(class_name, model_config, micro_batch, shape, chosen),
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
    files = {args.output: plan.to_json().encode()}
    written = [args.output]
    if args.plot:
        from partitioning.solve.plot import plan_png  # matplotlib is an optional extra

        files[args.plot] = plan_png(plan)
        written.append(args.plot)
    if args.module_to_device:
        placement = json.dumps(module_to_device(plan, model=model), indent=2) + "\n"
        if args.module_to_device == "-":
            report.append(placement.rstrip())
        else:
            files[Path(args.module_to_device)] = placement.encode()
            written.append(Path(args.module_to_device))
    if config is not None:
        placed, ipu_files = ipu_outputs(args, plan, config, family.definition)
        files.update(ipu_files)
        report.append(placed)
        written += list(ipu_files)
    report += [f"wrote {path}" for path in written]
    return report, files, plan


def _calibration(path: Path) -> Calibration:
    return Calibration.from_json(read_text(path, "calibration", MAX_CALIBRATION_BYTES), str(path))


def _calibrate(args: argparse.Namespace) -> str:
    """Measure this machine for the model and micro-batch the arguments describe; write the calibration."""
    import torch

    family = ModelFamily.load(args.family, args.version)
    class_name = args.class_name or family.definition.default_class
    if not family.class_info(class_name).trains:
        raise UserError(f"--calibrate times training steps: it needs a class that computes its loss, "
                        f"not {class_name}")
    if args.device == "meta":
        raise UserError("--calibrate needs a real --device (cpu or cuda)")
    _check_device(args.device)
    check_destinations({"--calibrate": args.calibrate}, _inputs(args))
    if not args.device.startswith("cuda"):
        torch.set_num_threads(args.threads)
    config = family.config(args.shape, args.config)
    micro_batch = family.micro_batch(args.batch or DEFAULT_BATCH, _lengths(args))
    shape = args.shape or (str(args.config) if args.config else family.definition.default_shape)
    torch.manual_seed(0)
    model = family.build(class_name, config, args.device)
    repeats = args.measure or 5
    chain = family_chain(family, class_name, config, micro_batch, 1, args.device, repeats, model=model, sublayers=True,
                         clock=clock(args.device))
    inputs = family.inputs(class_name, config, micro_batch, args.device)
    described = family.describe(class_name, config, micro_batch, shape, grain.SUBLAYER)
    result = calibrate(chain, model, inputs, described, repeats, args.threads)
    write_outputs({args.calibrate: result.to_json().encode()})
    return (f"calibrated {args.family} {args.version} {class_name} {shape}, micro-batch {micro_batch.describe()} "
            f"on {result.device} ({args.threads} thread(s)): {result.flops / 1e9:.3g} GFLOP/s, backward "
            f"{result.backward_factor:.2f}x forward, memory {result.memory_bandwidth / 1e9:.3g} GB/s, "
            f"{result.backend} link {result.bandwidth / 1e9:.3g} GB/s\nwrote {args.calibrate}")


def main(argv: list[str] | None = None) -> int:
    with terminate_as_interrupt():
        try:
            return _main(argv)
        except (KeyboardInterrupt, Interrupted):
            print("partition-model: interrupted", file=sys.stderr)
            return 2


def _main(argv: list[str] | None) -> int:
    try:
        parser = _parser()  # its flags come from the families' data
        args = parser.parse_args(argv)
    except UserError as exc:
        return report_error(exc)
    except SystemExit as exc:  # --help
        return 0 if exc.code in (0, None) else 2
    try:
        if args.target == "ipu" and args.ipu_plan is not None:
            return run_ipu(args)
        if args.calibrate is not None:
            print(_calibrate(args), flush=True)
            return 0
        report, files, plan = _plan(args)
        write_outputs(files)
        print("\n".join(report), flush=True)
        if args.run:
            _launch(args.output, args.stages, args.run_steps)
    except (UserError, OSError) as exc:
        return report_error(exc)
    except Exception as exc:  # last resort: a bug or an input nobody foresaw still gets one line
        if args.verbose:
            traceback.print_exc()
        detail = " ".join(str(exc).split())[:300]
        print(f"partition-model: error: internal error: {type(exc).__name__}: {detail} "
              f"(-v shows the traceback; please report it)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
