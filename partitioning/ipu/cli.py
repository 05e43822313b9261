"""``partition-model ... --target ipu``: place a plan on IPUs, print the table, write the code and options file.

``partitioning.cli`` owns the command; it adds these arguments with
:func:`add_ipu_arguments` and, for ``--target ipu``, calls :func:`run_ipu`
with the plan it just made (``--ipus`` stages), or lets ``--ipu-plan`` name
a plan file.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import replace
from pathlib import Path

from converter.atomic import write_all_atomic
from partitioning.ipu.codegen import render
from partitioning.ipu.config import IPUConfig
from partitioning.ipu.errors import IPUError
from partitioning.ipu.placement import Placement, plan_ipu
from partitioning.ipu.roles import roles_for
from partitioning.plan import Plan, PlanError
from partitioning.report import report_error

DEFAULT_CODE = Path("ipu_parallelize.py")
DEFAULT_OPTIONS = Path("poptorch_options.conf")


def add_ipu_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("IPU target (--target ipu)")
    group.add_argument("--ipus", type=int, help="IPUs per replica, one plan stage each (a power of two)")
    group.add_argument("--ipu-config", type=Path, metavar="JSON",
                       help="IPU config: replication, batching, precision, layers_per_ipu... (default: defaults)")
    group.add_argument("--ipu-form", choices=("stateless", "stateful"), default="stateless",
                       help="the model form to annotate (default: stateless, after model.make_stateless())")
    group.add_argument("--ipu-plan", type=Path, metavar="JSON", help="place this plan file instead of a new plan")
    group.add_argument("--ipu-code", type=Path, default=DEFAULT_CODE,
                       help=f"generated parallelize() module (default: {DEFAULT_CODE})")
    group.add_argument("--ipu-options", type=Path, default=DEFAULT_OPTIONS,
                       help=f"PopTorch options file for Options.loadFromFile (default: {DEFAULT_OPTIONS})")


def run_ipu(args: argparse.Namespace, plan: Plan | None = None) -> int:
    """Place ``plan`` (or ``args.ipu_plan``) on IPUs; 0 on success, 2 with a one-line error."""
    try:
        print(_run(args, plan))
    except (PlanError, OSError) as exc:
        return report_error(exc)
    return 0


def _config(args: argparse.Namespace) -> IPUConfig:
    config = IPUConfig.load(args.ipu_config) if args.ipu_config else IPUConfig()
    if args.ipus is None:
        return config
    if config.ipus_per_replica not in (None, args.ipus):
        raise IPUError(f"--ipus {args.ipus} but {args.ipu_config} sets ipus_per_replica {config.ipus_per_replica}: "
                       f"make them agree")
    return replace(config, ipus_per_replica=args.ipus)


def _run(args: argparse.Namespace, plan: Plan | None) -> str:
    config = _config(args)
    if plan is None:
        if args.ipu_plan is None:
            raise IPUError("no plan to place: partition with --ipus N, or give --ipu-plan PLAN.json")
        plan = Plan.from_json(args.ipu_plan.read_text(encoding="utf-8"))
    family = plan.model.get("family") or getattr(args, "family", None)
    if not family:
        raise IPUError("the plan does not say its model family: re-plan with partition-model")
    roles = roles_for(family, plan.model.get("class"), plan.model.get("config", {}), args.ipu_form == "stateless")
    placement = plan_ipu(plan, config, roles)
    words = ["partition-model", family, "--version", str(plan.model.get("version", "?")), "--target", "ipu",
             "--ipus", str(placement.ipus), "--ipu-form", args.ipu_form]
    if args.ipu_config:
        words += ["--ipu-config", str(args.ipu_config)]
    title = f"PopTorch options for {shlex.join(words)}"
    write_all_atomic({args.ipu_code: render(placement, shlex.join(words)).encode("utf-8"),
                      args.ipu_options: placement.config.options_text(title).encode("utf-8")})
    return "\n".join([format_placement(placement), f"wrote {args.ipu_code}", f"wrote {args.ipu_options}"])


def _table(rows: list[tuple[str, ...]], left: int) -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) if c >= left else cell.rjust(width)
                      for c, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in rows]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"


def format_placement(placement: Placement) -> str:
    config, model = placement.config, placement.plan.model
    what = " ".join(str(model[key]) for key in ("family", "version", "class") if key in model)
    form = f" ({placement.roles.form} form)" if placement.roles else ""
    total = placement.ipus * config.replication_factor
    mode = (f"training, gradient accumulation {config.gradient_accumulation} (>= 2N-1)" if config.training
            else f"inference ({config.inference_execution}), device iterations {config.device_iterations}")
    lines = [f"IPU placement of {what}{form}: {placement.ipus} IPUs x {config.replication_factor} replicas = "
             f"{total} IPUs; {mode}",
             f"pipeline: N = {placement.pipeline_stages} stages (AutoStage.AutoIncrement) for "
             f"{len(placement.stages)} plan stages"
             + (", re-split so the shared weight's IPU also carries its later users" if placement.rebalanced else "")]
    stage_of = {user_id: stage.index for stage in placement.pipeline() for user_id in stage.user_ids}
    members: dict[int, list[str]] = {}
    for unit, annotation in zip(placement.units, placement.in_effect()):
        if annotation is not None:
            members.setdefault(stage_of[annotation.user_id], []).append(unit.name)
    why: dict[int, str] = {}
    for annotation in placement.annotations:  # a merged pipeline stage is explained by its first block
        why.setdefault(stage_of[annotation.user_id], annotation.why)
    rows = [("pipeline stage", "IPU", "blocks", "starts because")]
    for stage in placement.pipeline():
        names = members[stage.index]  # a stage exists because a block starts in it
        blocks = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})"
        rows.append((str(stage.index), str(stage.ipu), blocks, why.get(stage.index, "")))
    lines += _table(rows, left=2)
    rows = [("IPU", "compute ms", "stage ms", "memory MB", "stage MB", "budget MB")]
    for cost in placement.ipu_costs():
        rows.append((str(cost.ipu), _ms(cost.compute), _ms(cost.stage_compute), f"{cost.memory_bytes / 1e6:.1f}",
                     f"{cost.stage_memory_bytes / 1e6:.1f}", f"{cost.budget_bytes / 1e6:.1f}"))
    lines += _table(rows, left=6)
    planned = max(stage.compute for stage in placement.plan.stages)
    lines.append(f"busiest IPU {_ms(placement.bottleneck)} ms per micro-batch (the plan's busiest stage: "
                 f"{_ms(planned)} ms); predicted step {_ms(placement.step_seconds)} ms")
    return "\n".join(lines)
