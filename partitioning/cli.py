"""``partition-model``: cost a generated model's block chain and split it into pipeline stages.

This module turns the command line into a :class:`~partitioning.request.Request`
and picks its target from :data:`TARGETS`; :mod:`partitioning.command` does
the work and :func:`common.cli.run` reports every failure in one line.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from common.cli import Parser, count, nonempty_path, positive_int, positive_number, run
from common.errors import UserError
from families import installed
from families.registry import definition, definitions
from partitioning import command
from partitioning.cost import granularity as grain
from partitioning.gpu.target import GPUTarget
from partitioning.ipu.target import IPUTarget
from partitioning.request import DEFAULT_BATCH, Request
from partitioning.schedules import AUTO, SCHEDULES, schedule_name
from partitioning.settings import TIED_SUMS
from partitioning.target import Target

PROG = "partition-model"
TARGETS: dict[str, Target] = {target.name: target for target in (GPUTarget(), IPUTarget())}


def main(argv: list[str] | None = None) -> int:
    return run(PROG, parse, lambda request: command.execute(request, TARGETS[request.target]), argv)


def parse(argv: list[str] | None) -> Request:
    values = vars(_parser().parse_args(argv))
    flags = {name.removeprefix("length_"): values.pop(name) for name in list(values) if name.startswith("length_")}
    lengths: dict[str, int] = {}
    for name, value in [*values.pop("seq_len"), *((n, v) for n, v in flags.items() if v is not None)]:
        if lengths.get(name, value) != value:
            raise UserError(f"sequence length {name!r} given twice: {lengths[name]} and {value}")
        lengths[name] = value
    target, options = TARGETS[values["target"]], None
    for each in TARGETS.values():  # every target's flags are parsed; the chosen one's become its options
        if each.options is not None:
            given = {field.name: values.pop(field.name) for field in fields(each.options)}
            options = each.options(**given) if each is target else options
    if values["version"] is None:  # the release this environment imports
        values["version"] = installed.default_release(definition(values["family"]).package)
    values["schedule"] = schedule_name(values["schedule"])  # any case, as the engine's get_schedule_class
    return Request(**values, lengths=lengths, options=options)


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
    parser = Parser(prog=PROG, description="Split a generated model into balanced pipeline stages.")
    families = definitions()
    parser.add_argument("family", help=f"model family (known: {', '.join(sorted(families))})")
    parser.add_argument("--version", help="transformers release the model was generated from (default: the one "
                                              "installed here)")
    parser.add_argument("--models-dir", type=nonempty_path, metavar="DIR",
                        help="the generated code: a convert-model --output-dir (default: the repository's "
                             "generated_models); the plan records it for --run and train-model")
    parser.add_argument("--stages", type=positive_int, help="number of pipeline stages K (with --target ipu: --ipus)")
    parser.add_argument("--target", choices=tuple(TARGETS), default="gpu",
                        help="; ".join(f"{target.name}: {target.summary}" for target in TARGETS.values()))
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
    batch.add_argument("--schedule", default="1f1b",
                       help=f"pipeline schedule, any case ({', '.join(SCHEDULES)}), or {AUTO}: the least predicted "
                            f"step time that fits")
    batch.add_argument("--tied-sum", choices=TIED_SUMS, default="ordered",
                       help="how the run sums the gradients of a weight several stages hold (the cost model's tied "
                            "term; --run and train-model run the plan's): 'ordered' bit for bit, 'allreduce' one "
                            "all-reduce a step (default ordered)")
    batch.add_argument("--virtual-stages", type=positive_int, metavar="V",
                       help="chunks per rank: >= 2 for the looped schedules (default 2), 2 for zbvzerobubble and "
                            "dualpipev, 1 otherwise; with auto, only this V")
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
    machine.add_argument("--no-recompute", dest="recompute", action="store_false",
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
    run.add_argument("--timeline", type=Path, metavar="FILE",
                     help="with --run: write every rank's timeline of every step (forward, backward, p2p waits, "
                          "tied sync, optimizer) as JSON")
    for target in TARGETS.values():
        target.add_arguments(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="tracebacks of internal errors")
    return parser


if __name__ == "__main__":
    sys.exit(main())
