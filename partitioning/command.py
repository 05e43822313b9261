"""What ``partition-model`` does with a request, whatever the target: check, cost, split, write, run.

Everything that can be checked is checked before the slow costing, in the
order a user would fix it; every file is then written in one all-or-nothing
write (:func:`partitioning.files.write_outputs`), and only then does the
target run anything.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from common.errors import UserError
from common.files import read_text
from families.family import ModelFamily
from partitioning.cost import granularity as grain
from partitioning.cost.calibration import Calibration, calibrate, clock
from partitioning.cost.chain import family_chain
from partitioning.cost.costing import Chain
from partitioning.files import check_destinations, read_plan, write_outputs
from partitioning.gpu.module_to_device import module_to_device
from partitioning.plan import Plan
from partitioning.request import DEFAULT_BATCH, Request
from partitioning.solve.partition import Settings, partition
from partitioning.solve.plot import plan_png  # matplotlib itself only when a plot is asked for
from partitioning.solve.report import format_plan
from partitioning.target import Target

MAX_CALIBRATION_BYTES = 16 << 20


def execute(request: Request, target: Target) -> int:
    plan_file = target.plan_file(request)
    if plan_file is not None:  # place a plan made before: only the target's files
        check_destinations(target.writes(request), target.reads(request))
        report, files = target.outputs(request, read_plan(plan_file))
    elif request.calibrate is not None:
        print(_calibrate(request, target), flush=True)
        return 0
    else:
        request, report, files = _plan(request, target)
    write_outputs(files)
    print("\n".join([*report, *(f"wrote {path}" for path in files)]), flush=True)
    target.run(request)
    return 0


def _check(request: Request, family: ModelFamily, target: Target) -> Request:
    """The request with the target's settlements, once everything that needs no costing is checked."""
    family.class_info(request.class_of(family.definition))  # an unknown class first
    request = target.check(request, family)
    if request.measure and request.device == "meta":
        raise UserError("--measure needs a real --device (cpu or cuda)")
    if request.measure and request.calibration:
        raise UserError("give --measure (time blocks now) or --calibration (times measured before), not both")
    _check_device(request.device)
    if request.plot and importlib.util.find_spec("matplotlib") is None:
        raise UserError("--plot needs matplotlib (pip install 'hf-pipeline-convert[plot]')")
    check_destinations({**request.writes(), **target.writes(request)}, {**request.reads(), **target.reads(request)})
    return request


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


def _plan(request: Request, target: Target) -> tuple[Request, list[str], dict[Path, bytes]]:
    """The settled request, the report lines and the files to write (nothing is written here)."""
    family = ModelFamily.load(request.family, request.version, request.models_dir)
    request = _check(request, family, target)
    assert request.stages is not None and request.batch is not None  # settled by the target
    calibration = _calibration(request.calibration) if request.calibration else None
    class_name = request.class_of(family.definition)
    model_config = family.config(request.shape, request.config)
    micro_batch = family.micro_batch(request.batch, dict(request.lengths))
    family.check_limits(model_config, micro_batch, _where(request, family))
    settings = Settings(device_flops=request.device_flops * 1e12, bandwidth=request.bandwidth * 1e9,
                        memory_limit=request.memory_gb * 1e9 if request.memory_gb is not None else None,
                        micro_batches=request.micro_batches, schedule=request.schedule,
                        virtual_stages=request.virtual_stages,
                        optimizer_states=request.optimizer_states, master_weights=request.master_weights,
                        measured=bool(request.measure), memory_bandwidth=request.memory_bandwidth * 1e9,
                        recompute=request.recompute, tied_sum=request.tied_sum)
    if calibration is not None:
        settings = calibration.settings(settings)
    granularity = request.granularity
    model = family.build(class_name, model_config, request.device)
    sublayers = granularity in (grain.AUTO, grain.SUBLAYER)
    chain = family_chain(family, class_name, model_config, micro_batch,
                         granularity if isinstance(granularity, int) else 1, request.device, request.measure,
                         model=model, sublayers=sublayers)
    shape = request.shape_of(family.definition)
    layer_lists = family.layer_lists(class_name)
    if calibration is not None:
        chain = calibration.apply(chain, layer_lists,
                                  family.describe(class_name, model_config, micro_batch, shape, 1))
    stages = request.stages

    def plan_of(candidate: Chain, chosen: str | int) -> Plan:
        description = {**family.describe(class_name, model_config, micro_batch, shape, chosen),
                       "shared_bytes": candidate.shared_bytes}
        return partition(candidate.blocks, stages, settings, description, candidate.values)

    if granularity == grain.AUTO:
        plan, chain = grain.choose(chain, layer_lists, plan_of)
    else:
        plan = plan_of(chain, granularity)
    report = [f"{request.family} {request.version} {class_name} {shape}: {len(chain.blocks)} blocks "
              f"(granularity {plan.model['granularity']}), micro-batch {micro_batch.describe()}, "
              f"{request.micro_batches} micro-batches, {request.schedule}"
              + (f", calibrated on {calibration.device}" if calibration is not None else ""),
              format_plan(plan)]
    files = {request.output: plan.to_json().encode()}
    if request.plot:
        files[request.plot] = plan_png(plan)
    if request.module_to_device:
        placement = json.dumps(module_to_device(plan, model=model), indent=2) + "\n"
        if request.module_to_device == "-":
            report.append(placement.rstrip())
        else:
            files[Path(request.module_to_device)] = placement.encode()
    placed, placed_files = target.outputs(request, plan)
    return request, report + placed, {**files, **placed_files}


def _where(request: Request, family: ModelFamily) -> str:
    """Where the model's config came from, for its errors."""
    return f"config {request.config}" if request.config else f"shape {request.shape_of(family.definition)}"


def _calibration(path: Path) -> Calibration:
    return Calibration.from_json(read_text(path, "calibration", MAX_CALIBRATION_BYTES), str(path))


def _calibrate(request: Request, target: Target) -> str:
    """Measure this machine for the model and micro-batch the request describes; write the calibration."""
    import torch

    assert request.calibrate is not None
    family = ModelFamily.load(request.family, request.version, request.models_dir)
    class_name = request.class_of(family.definition)
    if not family.class_info(class_name).trains:
        raise UserError(f"--calibrate times training steps: it needs a class that computes its loss, "
                        f"not {class_name}")
    if request.device == "meta":
        raise UserError("--calibrate needs a real --device (cpu or cuda)")
    _check_device(request.device)
    check_destinations({"--calibrate": request.calibrate}, {**request.reads(), **target.reads(request)})
    if not request.device.startswith("cuda"):
        torch.set_num_threads(request.threads)
    config = family.config(request.shape, request.config)
    micro_batch = family.micro_batch(request.batch or DEFAULT_BATCH, dict(request.lengths))
    family.check_limits(config, micro_batch, _where(request, family))
    shape = request.shape_of(family.definition)
    torch.manual_seed(0)
    model = family.build(class_name, config, request.device)
    repeats = request.measure or 5
    chain = family_chain(family, class_name, config, micro_batch, 1, request.device, repeats, model=model,
                         sublayers=True, clock=clock(request.device))
    inputs = family.inputs(class_name, config, micro_batch, request.device)
    described = family.describe(class_name, config, micro_batch, shape, grain.SUBLAYER)
    result = calibrate(chain, model, inputs, described, repeats, request.threads,
                       micro_batches=request.micro_batches)
    write_outputs({request.calibrate: result.to_json().encode()})
    return (f"calibrated {request.family} {request.version} {class_name} {shape}, micro-batch "
            f"{micro_batch.describe()} on {result.device} ({request.threads} thread(s)): "
            f"{result.flops / 1e9:.3g} GFLOP/s, backward {result.backward_factor:.2f}x forward, memory "
            f"{result.memory_bandwidth / 1e9:.3g} GB/s, {result.backend} link {result.bandwidth / 1e9:.3g} GB/s; "
            f"runtime: {result.latency * 1e6:.0f} us per message, {result.action_overhead * 1e6:.0f} us per action, "
            f"optimizer {result.update_rate * 1e9:.3g} s per GB of parameters\n"
            f"wrote {request.calibrate}")
