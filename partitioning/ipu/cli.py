"""``partition-model ... --target ipu``: place a plan on IPUs, print the table, make the code and options file.

``partitioning.cli`` owns the command.  It adds these arguments with
:func:`add_ipu_arguments`, reads the IPU config with :func:`ipu_config`
before it costs anything (a bad config or IPU count fails at once), and for
``--target ipu`` places the plan it made with :func:`ipu_outputs`, writing
the code and options file in the same all-or-nothing write as the plan.
:func:`run_ipu` places a plan file instead (``--ipu-plan``).
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

from families.definition import FamilyDefinition
from partitioning.arguments import positive_int
from partitioning.files import check_destinations, read_plan, write_outputs
from partitioning.ipu.codegen import render
from partitioning.ipu.config import IPUConfig
from partitioning.ipu.errors import IPUError
from partitioning.ipu.memory import TERM_COLUMNS
from partitioning.ipu.placement import Placement, plan_ipu
from partitioning.ipu.roles import roles_for
from partitioning.ipu.section import PublishedLayout, ipu_section
from partitioning.plan import Plan
from common.errors import UserError
from partitioning.solve.report import report_error

DEFAULT_CODE = Path("ipu_parallelize.py")
DEFAULT_OPTIONS = Path("poptorch_options.conf")


def add_ipu_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("IPU target (--target ipu)")
    group.add_argument("--ipus", type=positive_int,
                       help="IPUs per replica, one plan stage each (a power of two; default: the family's [ipu])")
    group.add_argument("--ipu-config", type=Path, metavar="JSON",
                       help="IPU config: replication, batching, precision, layers_per_ipu... (default: the family's)")
    group.add_argument("--ipu-form", choices=("stateless", "stateful"), default="stateless",
                       help="the model form to annotate (default: stateless, after model.make_stateless())")
    group.add_argument("--ipu-plan", type=Path, metavar="JSON", help="place this plan file instead of a new plan")
    group.add_argument("--ipu-code", type=Path, default=DEFAULT_CODE,
                       help=f"generated parallelize() module (default: {DEFAULT_CODE})")
    group.add_argument("--ipu-options", type=Path, default=DEFAULT_OPTIONS,
                       help=f"PopTorch options file for Options.loadFromFile (default: {DEFAULT_OPTIONS})")


def ipu_destinations(args: argparse.Namespace) -> dict[str, Path]:
    return {"--ipu-code": args.ipu_code, "--ipu-options": args.ipu_options}


def ipu_config(args: argparse.Namespace, definition: FamilyDefinition | None, planned: Plan | None = None
               ) -> IPUConfig:
    """The IPU config (the family's ``[ipu]`` defaults under ``--ipu-config``), with IPUs and micro-batch settled.

    Everything that needs no plan is checked here, before any costing: the
    config's values, ``--ipus`` against ``ipus_per_replica``, the power-of-two
    rule and the length of per-IPU lists.  The IPU count is ``--ipus``, else
    the config's, else ``--stages`` or the ``planned`` plan's stages, else the
    family's; the micro-batch is ``--batch``, else the config's, else the
    planned plan's or the family's.
    """
    defaults = ipu_section(definition).defaults
    family_ipus = defaults.pop("ipus_per_replica", None)
    family_batch = defaults.pop("micro_batch_size", None)  # the family's applies to new plans only
    config = (IPUConfig.load(args.ipu_config, defaults) if args.ipu_config
              else IPUConfig.from_dict({}, "the family's [ipu] section", defaults))
    ipus = args.ipus
    if ipus is not None and config.ipus_per_replica not in (None, ipus):
        raise IPUError(f"--ipus {ipus} but {args.ipu_config} sets ipus_per_replica {config.ipus_per_replica}: "
                       f"make them agree")
    stages = len(planned.stages) if planned is not None else getattr(args, "stages", None)
    ipus = ipus or config.ipus_per_replica or stages or family_ipus
    if ipus is None:
        raise IPUError("how many IPUs? give --ipus N (the family has no [ipu] default)")
    batch = getattr(args, "batch", None)
    if batch is not None and config.micro_batch_size not in (None, batch):
        raise IPUError(f"--batch {batch} but {args.ipu_config} sets micro_batch_size {config.micro_batch_size}: "
                       f"make them agree")
    batch = batch or config.micro_batch_size
    if planned is not None:
        costed = planned.model.get("micro_batch", {})
        costed = costed.get("batch") if isinstance(costed, dict) else None
        if batch is not None and costed is not None and batch != costed:
            raise IPUError(f"the plan was costed for micro-batches of {costed}, not {batch}: re-plan with "
                           f"--target ipu --batch {batch}")
        batch = costed
    config = replace(config, ipus_per_replica=ipus, micro_batch_size=batch or family_batch)
    total = ipus * config.replication_factor
    if total & (total - 1) and not config.auto_round_num_ipus:
        raise IPUError(f"{ipus} IPUs x {config.replication_factor} replicas = {total} IPUs, not a power of two as "
                       f"PopTorch requires: use a power of two or set auto_round_num_ipus")
    for name in ("available_memory_proportion", "layers_per_ipu"):
        value = getattr(config, name)
        if isinstance(value, tuple) and len(value) != ipus:
            raise IPUError(f"{name} lists {len(value)} values for {ipus} IPUs: give one per IPU"
                           + (" or a single number" if name == "available_memory_proportion" else ""))
    return config


def _model_field(plan: Plan, key: str, required: bool = True) -> Any:
    value = plan.model.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise IPUError(f"the plan's model.{key} must name the {key}, got {value!r:.40}: re-plan with partition-model")
    return value


def ipu_outputs(args: argparse.Namespace, plan: Plan, config: IPUConfig,
                definition: FamilyDefinition | None = None) -> tuple[str, dict[Path, bytes]]:
    """Place ``plan``: the placement's table and the files to write (the code and the options file)."""
    family = _model_field(plan, "family")
    if definition is not None and family != definition.family:
        raise IPUError(f"the plan is for the {family} family, not {definition.family}: re-plan")
    config_data = plan.model.get("config", {})
    roles = roles_for(family, _model_field(plan, "class", required=False), config_data,
                      args.ipu_form == "stateless")
    placement = plan_ipu(plan, config, roles)
    words = ["partition-model", family, "--version", _model_field(plan, "version"), *_shape_words(plan, definition),
             "--target", "ipu", "--ipus", str(placement.ipus), "--ipu-form", args.ipu_form]
    if args.ipu_config:
        words += ["--ipu-config", str(args.ipu_config)]
    title = f"PopTorch options for {shlex.join(words)}"
    files = {args.ipu_code: render(placement, shlex.join(words)).encode("utf-8"),
             args.ipu_options: placement.config.options_text(title).encode("utf-8")}
    shape = plan.model.get("shape")
    published = ipu_section(definition).layout(shape) if isinstance(shape, str) else None
    return format_placement(placement, published), files


def _shape_words(plan: Plan, definition: FamilyDefinition | None) -> list[str]:
    """The options that give the plan's model and micro-batch again (its config file, where it came from one)."""
    model, words = plan.model, []
    shape, class_name = model.get("shape"), model.get("class")
    if isinstance(shape, str):
        named = definition is not None and shape in definition.shapes
        words += ["--shape" if named else "--config", shape]
    if isinstance(class_name, str):
        words += ["--class", class_name]
    granularity = model.get("granularity")
    if isinstance(granularity, int) and granularity != 1:
        words += ["--granularity", str(granularity)]
    micro_batch = model.get("micro_batch")
    if isinstance(micro_batch, dict):
        words += ["--batch", str(micro_batch.get("batch"))]
        lengths = micro_batch.get("lengths")
        for name, size in (lengths.items() if isinstance(lengths, dict) else ()):
            words += ["--seq-len", f"{name}={size}"]
    return words


def run_ipu(args: argparse.Namespace, plan: Plan | None = None) -> int:
    """Place ``plan`` (or the ``--ipu-plan`` file) on IPUs; 0 on success, 2 with a one-line error."""
    try:
        check_destinations(ipu_destinations(args), {"--ipu-plan": args.ipu_plan, "--ipu-config": args.ipu_config})
        if plan is None:
            if args.ipu_plan is None:
                raise IPUError("no plan to place: partition with --ipus N, or give --ipu-plan PLAN.json")
            plan = read_plan(args.ipu_plan)
        definition = _definition(_model_field(plan, "family"))
        report, files = ipu_outputs(args, plan, ipu_config(args, definition, plan), definition)
        write_outputs(files)
        print("\n".join([report, *(f"wrote {path}" for path in files)]))
    except (UserError, OSError) as exc:
        return report_error(exc)
    return 0


def _definition(family: str) -> FamilyDefinition | None:
    from families.family import definitions

    return definitions().get(family)  # an unknown family is refused by roles_for, naming the known ones


def _table(rows: list[tuple[str, ...]], left: int) -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) if c >= left else cell.rjust(width)
                      for c, (cell, width) in enumerate(zip(row, widths))).rstrip() for row in rows]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g}"


def _mb(size: float) -> str:
    return f"{size / 1e6:.1f}"


def format_placement(placement: Placement, published: PublishedLayout | None = None) -> str:
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
    precision = "float16" if config.half_precision else "float32"
    optimizer = ("off chip" if config.optimizer_state_offchip else
                 "sharded over replicas" if config.replicated_tensor_sharding and config.replication_factor > 1
                 else "on chip")
    lines.append(f"memory (MB) for micro-batch {_micro_batch(model)}, {precision} weights and activations, optimizer "
                 f"state {optimizer}, {len(placement.memory.checkpoints)} recomputation checkpoints, projection "
                 f"serialized x{config.embedding_serialization_factor}:")
    terms = list(TERM_COLUMNS)
    rows = [("IPU", "compute ms", "stage ms", *TERM_COLUMNS.values(), "total", "of")]
    for cost in placement.ipu_costs():
        rows.append((str(cost.ipu), _ms(cost.compute), _ms(cost.stage_compute),
                     *(_mb(getattr(cost.memory, t)) for t in terms), _mb(cost.memory_bytes), _mb(cost.budget_bytes)))
    lines += _table(rows, left=len(rows[0]))
    planned = max(stage.compute for stage in placement.plan.stages)
    lines.append(f"busiest IPU {_ms(placement.bottleneck)} ms per micro-batch (the plan's busiest stage: "
                 f"{_ms(planned)} ms); predicted step {_ms(placement.step_seconds)} ms")
    layout = f"layers_per_ipu {placement.layers_per_ipu()}"
    if published is not None and published.ipus == placement.ipus:
        layout += f"; published for {published.shape}: {list(published.layers_per_ipu)} ({published.source})"
    lines.append(layout)
    return "\n".join(lines)


def _micro_batch(model: dict[str, Any]) -> str:
    micro_batch = model.get("micro_batch")
    if not isinstance(micro_batch, dict):
        return "as planned"
    lengths = micro_batch.get("lengths")
    sizes = ", ".join(f"{k} {v}" for k, v in lengths.items()) if isinstance(lengths, dict) else "?"
    return f"{micro_batch.get('batch', '?')} x {sizes}"
