"""``--target gpu``: torch.distributed.pipelining, one or more stages per rank (NCCL on GPUs, gloo on CPU ranks).

The plan is the whole output; ``--run`` then trains it under torchrun
(:mod:`partitioning.gpu.launch`).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from common.errors import UserError
from families.family import ModelFamily
from partitioning.gpu.launch import launch
from partitioning.plan import Plan
from partitioning.request import DEFAULT_BATCH, Request
from partitioning.schedules import AUTO, check_runs, default_virtual_stages


class GPUTarget:
    name = "gpu"
    summary = "torch.distributed.pipelining (CPU ranks work too)"
    options = None  # no flags of its own: --run and --run-steps are partition-model's

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def plan_file(self, request: Request) -> Path | None:
        return None

    def check(self, request: Request, family: ModelFamily) -> Request:
        stages = request.stages
        if stages is None:
            raise UserError("--stages K is required (or --target ipu --ipus N)")
        request = replace(request, batch=request.batch or DEFAULT_BATCH)
        if request.timeline is not None and not request.run:
            raise UserError("--timeline records a pipelined run: give --run too")
        if not request.run:
            return request
        info = family.class_info(request.class_of(family.definition))
        if not info.trains:
            trainers = family.training_classes()
            raise UserError(f"--run trains, so it needs {' or '.join(trainers) or 'a class that computes a loss'} "
                            f"(a class whose forward returns its loss); {info.name} returns its {info.output}")
        if request.schedule != AUTO:  # the engine's own rule for this schedule (auto: checked once chosen)
            virtual = request.virtual_stages or default_virtual_stages(request.schedule)
            try:
                check_runs(request.schedule, stages, virtual, request.micro_batches)
            except UserError as exc:
                raise UserError(f"--run: {exc}: raise --micro-batches or choose another --schedule") from None
        return request

    def reads(self, request: Request) -> dict[str, Path | None]:
        return {}

    def writes(self, request: Request) -> dict[str, Path]:
        return {"--timeline": request.timeline} if request.timeline is not None else {}

    def outputs(self, request: Request, plan: Plan) -> tuple[list[str], dict[Path, bytes]]:
        return [], {}

    def run(self, request: Request) -> None:
        if request.run:
            assert request.stages is not None  # settled by check()
            launch(request.output, request.stages, request.run_steps, request.timeline, request.tied_sum)
