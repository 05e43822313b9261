"""``--target ipu``: place the plan on IPUs, print the placement, make the ``parallelize()`` code and options file.

The IPU config is read and checked before anything is costed (a bad config
or IPU count fails at once).  A plan is placed the same way whether the
command just made it or reads it from ``--ipu-plan``: :meth:`IPUTarget.outputs`.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common import generated
from common.cli import positive_int
from common.errors import UserError
from families.definition import FamilyDefinition
from families.family import ModelFamily
from families.registry import definitions
from partitioning.cost import granularity as grain
from partitioning.files import check_destinations
from partitioning.ipu.codegen import render
from partitioning.ipu.config import IPUConfig
from partitioning.ipu.errors import IPUError
from partitioning.ipu.placement import Placement, plan_ipu
from partitioning.ipu.report import format_placement
from partitioning.ipu.roles import roles_for
from partitioning.ipu.section import ipu_section
from partitioning.plan import Plan
from partitioning.request import DEFAULT_BATCH, Request

DEFAULT_CODE = Path("ipu_parallelize.py")
DEFAULT_OPTIONS = Path("poptorch_options.conf")


@dataclass(frozen=True)
class IPUOptions:
    """The ``--ipu-*`` flags."""

    ipus: int | None
    ipu_config: Path | None
    ipu_form: str  # "stateless" (after model.make_stateless()) or "stateful"
    ipu_plan: Path | None
    ipu_code: Path
    ipu_options: Path


class IPUTarget:
    name = "ipu"
    summary = "PopTorch placement"
    options = IPUOptions

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("IPU target (--target ipu)")
        group.add_argument("--ipus", type=positive_int,
                           help="IPUs per replica, one plan stage each (a power of two; default: the family's [ipu])")
        group.add_argument("--ipu-config", type=Path, metavar="JSON",
                           help="IPU config: replication, batching, precision, layers_per_ipu... (default: the "
                                "family's)")
        group.add_argument("--ipu-form", choices=("stateless", "stateful"), default="stateless",
                           help="the model form to annotate (default: stateless, after model.make_stateless())")
        group.add_argument("--ipu-plan", type=Path, metavar="JSON", help="place this plan file instead of a new plan")
        group.add_argument("--ipu-code", type=Path, default=DEFAULT_CODE,
                           help=f"generated parallelize() module (default: {DEFAULT_CODE})")
        group.add_argument("--ipu-options", type=Path, default=DEFAULT_OPTIONS,
                           help=f"PopTorch options file for Options.loadFromFile (default: {DEFAULT_OPTIONS})")

    def plan_file(self, request: Request) -> Path | None:
        return _options(request).ipu_plan

    def check(self, request: Request, family: ModelFamily) -> Request:
        options = _options(request)
        unsupported = ipu_section(family.definition).unsupported
        if unsupported:
            raise UserError(f"IPU is not supported for the {family.name} family: {unsupported}")
        check_destinations(self.writes(request), self.reads(request))  # a directory, an input: said first
        _refuse_edited(options)
        if request.run:
            raise UserError("--run trains with torch.distributed.pipelining; for IPUs use the generated code and "
                            "options file on a machine with the Poplar SDK (drop --run or --target ipu)")
        if request.stages is not None and options.ipus is not None and request.stages != options.ipus:
            raise UserError(f"--stages {request.stages} and --ipus {options.ipus} disagree: one stage per IPU")
        _check_static(family.config(request.shape, request.config).to_dict(), "the model's config")
        config = ipu_config(options, family.definition, stages=request.stages, batch=request.batch)
        granularity = 1 if request.granularity == grain.AUTO else request.granularity  # placement takes whole layers
        # PopTorch runs the model as traced: a value crossing IPUs is sent, never recomputed.
        return replace(request, stages=config.ipus_per_replica, batch=config.micro_batch_size or DEFAULT_BATCH,
                       granularity=granularity, recompute=False)

    def reads(self, request: Request) -> dict[str, Path | None]:
        options = _options(request)
        return {"--ipu-config": options.ipu_config, "--ipu-plan": options.ipu_plan}

    def writes(self, request: Request) -> dict[str, Path]:
        options = _options(request)
        return {"--ipu-code": options.ipu_code, "--ipu-options": options.ipu_options}

    def outputs(self, request: Request, plan: Plan) -> tuple[list[str], dict[Path, bytes]]:
        options = _options(request)
        _refuse_edited(options)
        if options.ipu_plan is not None:
            _check_planned(request, plan, options.ipu_plan)
        model_config = plan.model.get("config")
        _check_static(model_config if isinstance(model_config, dict) else {}, "the plan's model config")
        family = _model_field(plan, "family")
        definition = definitions().get(family)  # an unknown family is refused by roles_for, naming the known ones
        config = ipu_config(options, definition, batch=request.batch, planned=plan)
        roles = roles_for(family, _model_field(plan, "class", required=False), plan.model.get("config", {}),
                          options.ipu_form == "stateless")
        placement = plan_ipu(plan, config, roles)
        words = ["partition-model", family, "--version", _model_field(plan, "version"),
                 *_shape_words(plan, definition), "--target", "ipu", "--ipus", str(placement.ipus),
                 "--ipu-form", options.ipu_form]
        if options.ipu_config:
            words += ["--ipu-config", str(options.ipu_config)]
        shape = plan.model.get("shape")
        published = ipu_section(definition).layout(shape) if isinstance(shape, str) else None
        files = placement_files(placement, shlex.join(words), options.ipu_code, options.ipu_options)
        return [format_placement(placement, published)], files

    def run(self, request: Request) -> None:
        pass  # the code runs on a machine with the Poplar SDK


def placement_files(placement: Placement, command: str, code: Path, options: Path) -> dict[Path, bytes]:
    """The ``parallelize()`` module and the PopTorch options file of ``placement``, both naming ``command``."""
    return {code: render(placement, command).encode("utf-8"),
            options: placement.config.options_text(f"@generated by partition-model: PopTorch options for {command}")
            .encode("utf-8")}


def ipu_config(options: IPUOptions, definition: FamilyDefinition | None, stages: int | None = None,
               batch: int | None = None, planned: Plan | None = None) -> IPUConfig:
    """The IPU config (the family's ``[ipu]`` defaults under ``--ipu-config``), with IPUs and micro-batch settled.

    Everything that needs no plan is checked here, before any costing: the
    config's values, ``--ipus`` against ``ipus_per_replica``, the power-of-two
    rule and the length of per-IPU lists.  The IPU count is ``--ipus``, else
    the config's, else ``stages`` or the ``planned`` plan's stages, else the
    family's; the micro-batch is ``batch`` (``--batch``), else the config's,
    else the planned plan's or the family's.
    """
    defaults = ipu_section(definition).defaults
    family_ipus = defaults.pop("ipus_per_replica", None)
    family_batch = defaults.pop("micro_batch_size", None)  # the family's applies to new plans only
    config = (IPUConfig.load(options.ipu_config, defaults) if options.ipu_config
              else IPUConfig.from_dict({}, "the family's [ipu] section", defaults))
    ipus = options.ipus
    if ipus is not None and config.ipus_per_replica not in (None, ipus):
        raise IPUError(f"--ipus {ipus} but {options.ipu_config} sets ipus_per_replica {config.ipus_per_replica}: "
                       f"make them agree")
    stages = len(planned.stages) if planned is not None else stages
    ipus = ipus or config.ipus_per_replica or stages or family_ipus
    if ipus is None:
        raise IPUError("how many IPUs? give --ipus N (the family has no [ipu] default)")
    if batch is not None and config.micro_batch_size not in (None, batch):
        raise IPUError(f"--batch {batch} but {options.ipu_config} sets micro_batch_size {config.micro_batch_size}: "
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


def _refuse_edited(options: IPUOptions) -> None:
    """A file of ours that its user edited (and so dropped its @generated line) is theirs: never replaced."""
    for flag, path in (("--ipu-code", options.ipu_code), ("--ipu-options", options.ipu_options)):
        generated.refuse_foreign(path, "partition-model", f"keep it and give another {flag}, or move it away")


def _check_static(config: dict[str, Any], where: str) -> None:
    """PopTorch compiles one static graph: no layer may be skipped at random (transformers' ``*layerdrop``)."""
    for key, value in config.items():
        if key.endswith("layerdrop") and value not in (0, 0.0, None):
            raise IPUError(f"{where} sets {key} = {value!r:.20}: PopTorch runs one static graph, which cannot skip "
                           f"layers at random", hint=f"set {key} to 0 for the IPU")


def _check_planned(request: Request, plan: Plan, path: Path) -> None:
    """The plan is of the model the command names: its family and release, and its shape, class and lengths where
    the command gives them (those it leaves out are the plan's).  A field that names nothing is _model_field's."""
    model = plan.model
    micro_batch = model.get("micro_batch")
    lengths = micro_batch.get("lengths") if isinstance(micro_batch, dict) else None
    named = {"family": request.family, "version": request.version, "class": request.class_name,
             "shape": request.shape or (str(request.config) if request.config else None)}
    for key, wanted in named.items():
        if wanted is not None and isinstance(model.get(key), str) and model.get(key) != wanted:
            raise IPUError(f"--ipu-plan {path} is a plan for {key} {model.get(key)!r:.60}, not {wanted!r:.60} as the "
                           f"command names: give the plan's {key} or re-plan")
    for name, size in request.lengths.items():
        if not isinstance(lengths, dict) or lengths.get(name) != size:
            found = lengths.get(name) if isinstance(lengths, dict) else None
            raise IPUError(f"--ipu-plan {path} was costed for a {name} length of {found!r:.20}, not {size}: give the "
                           f"plan's lengths or re-plan")


def _options(request: Request) -> IPUOptions:
    assert isinstance(request.options, IPUOptions), "a request for another target"
    return request.options


def _model_field(plan: Plan, key: str, required: bool = True) -> Any:
    value = plan.model.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise IPUError(f"the plan's model.{key} must name the {key}, got {value!r:.40}: re-plan with partition-model")
    return value


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
