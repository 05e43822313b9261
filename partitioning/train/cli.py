"""``train-model``: train a plan's stages from a stock checkpoint on a JSON Lines data file, raw text or a dataset.

    train-model --plan plan.json --checkpoint my-t5/ --data train.jsonl --steps 1000 --save out/ \\
        --lr 1e-4 --warmup-steps 100 --decay cosine --clip-grad 1.0 --save-every 200

Everything that can be checked is checked here, before any rank starts: the
plan, the checkpoint against it (family, class, sizes, every key and shape),
every line of the data file, the save and resume directories.  Then torchrun
starts one rank per stage (:mod:`partitioning.train.rank`); a rank's failure is
one line naming the rank, the others are stopped, exit 2.
"""

from __future__ import annotations

import math
import shlex
import sys
import tempfile
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from common.cli import run
from common.errors import UserError
from families.checkpoint import Checkpoint
from families.definition import BATCH, InputSpec
from families.loading import build_meta, check_checkpoint, check_tied, checkpoint_config
from families.models import MicroBatch
from partitioning.files import read_plan
from partitioning.gpu.launch import run_ranks, torchrun_command
from partitioning.gpu.pipelining import splits_backward
from partitioning.gpu.schedule_stages import check_placement
from partitioning.train.data import check_learnable, is_label, read_dataset
from partitioning.train.inputs import Sources, examples_files
from partitioning.train.layout import SETTINGS
from partitioning.train.request import (
    PROG,
    RANK_MODULE,
    Request,
    check_resumed,
    kept_settings,
    parse,
    settings_text,
    to_argv,
)
from partitioning.train.save import check_save_dir, read_state, tidy
from partitioning.train.stage import plan_model, settings_of


def execute(request: Request) -> int:
    """Check everything, then start the ranks; ``--text`` and ``--dataset`` are written as the JSON Lines
    examples files they read first (partitioning/train/inputs.py)."""
    sources = request.sources()
    if not sources.converted:
        return _execute(request, request)
    family, class_name, _, specs, micro_batch = plan_model(read_plan(request.plan), request.models_dir)
    causal = family.definition.classes[class_name].causal_lm
    start = request.checkpoint or request.resume
    assert start is not None  # parse() demands one
    config = Checkpoint(start).config  # the config trained is the checkpoint's
    with tempfile.TemporaryDirectory(prefix="train-model-data.") as scratch:
        data, eval_data = examples_files(sources, specs, causal, class_name, dict(micro_batch.lengths), config,
                                         start, request.seed, Path(scratch))
        converted: dict[str, Any] = {field.name: None for field in fields(Sources)}  # the ranks read the files
        return _execute(replace(request, **{**converted, "data": data, "eval_data": eval_data}), request)


def _execute(request: Request, shown: Request) -> int:
    """``shown``: the request as the user gave it (what the printed per-machine commands repeat)."""
    plan = read_plan(request.plan)
    family, class_name, config, specs, micro_batch = plan_model(plan, request.models_dir)
    micro_batches, schedule = settings_of(plan, request.micro_batches)
    stages = len(set(plan.ranks))  # ranks per pipeline: the plan's stages, or its chunks over the ranks (V > 1)
    if schedule == "1f1b" and micro_batches < stages:
        raise UserError(f"the 1f1b schedule needs micro-batches ({micro_batches}) >= stages ({stages})")
    virtual = check_placement(plan, schedule, stages, micro_batches)
    if request.data_parallel > 1 and splits_backward(schedule, stages, virtual, micro_batches):
        raise UserError(f"data parallelism runs schedules that do not split the backward: {schedule} does "
                        f"(re-plan with another schedule for --data-parallel)")
    state = read_state(request.resume, stages) if request.resume is not None else None  # a save of ours, first
    source = Checkpoint(request.resume or request.checkpoint)  # type: ignore[arg-type]
    config, taken = checkpoint_config(config, source, family, class_name, request.config_from_checkpoint)
    if taken:
        print(f"{PROG}: warning: training the checkpoint's config where the plan's differs: {', '.join(taken)}",
              file=sys.stderr)
    meta = build_meta(family, class_name, config)
    check_checkpoint(meta, source, family, class_name, config)
    check_tied(meta, source)
    assert request.data is not None
    dataset = read_dataset(request.data, specs, config, micro_batch, micro_batch.batch * micro_batches)
    check_learnable(dataset, specs, family.definition.classes[class_name].causal_lm, request.data)
    if request.eval_data is not None:
        check_eval_data(request.eval_data, specs, config, micro_batch, family.definition.classes[class_name].causal_lm,
                        micro_batch.batch * micro_batches * request.data_parallel)
    if request.epochs is not None:
        request = replace(request, steps=epoch_steps(request.epochs, dataset.count,
                                                     micro_batch.batch * micro_batches * request.data_parallel),
                          epochs=None)
    assert request.steps is not None
    if state is not None:
        if state["step"] >= request.steps:
            span = f"--steps {request.steps}" if shown.epochs is None else f"--epochs {shown.epochs:g} " \
                                                                            f"({request.steps} steps)"
            raise UserError(f"--resume {request.resume} is at step {state['step']}: {span} leaves nothing to do")
        check_resumed(request, state, kept_settings(request, plan, micro_batches))
    if request.save is not None:
        check_save_dir(request.save)
    ranks = stages * request.data_parallel
    if ranks % request.nnodes:
        raise UserError(f"{ranks} ranks ({stages} stages x --data-parallel {request.data_parallel}) do not divide "
                        f"among --nnodes {request.nnodes}")
    per_node = ranks // request.nnodes
    argv = to_argv(replace(request, nnodes=1, node_rank=None, rdzv_endpoint=None, config_file=None))
    if request.nnodes > 1 and request.node_rank is None:
        endpoint = request.rdzv_endpoint or "NODE0_HOST:29500"
        for node in range(request.nnodes):  # what each machine runs (the same paths on every machine)
            command = torchrun_command(RANK_MODULE, argv, per_node, request.nnodes, node, endpoint)
            if shown.sources().converted:  # each machine converts its data itself: it runs train-model
                command = [PROG, *to_argv(replace(shown, node_rank=node, rdzv_endpoint=endpoint, config_file=None))]
            print(" ".join(shlex.quote(part) for part in command))
        return 0
    print(f"{PROG}: plan, checkpoint and data checked; starting {per_node} of {ranks} ranks ({stages} stages x "
          f"{request.data_parallel} replica(s))", flush=True)
    try:
        with tempfile.TemporaryDirectory(prefix="train-model-settings.") as scratch:
            echo = Path(scratch) / SETTINGS  # the run's settings as the user gave them: the saves hold them
            echo.write_text(settings_text(shown), encoding="utf-8")
            run_ranks(RANK_MODULE, [*argv, "--echo-settings", str(echo)], per_node, PROG, nodes=request.nnodes,
                      node_rank=request.node_rank, endpoint=request.rdzv_endpoint)
    except BaseException:  # the ranks are stopped (a failure, Ctrl-C): a save they were writing is rolled back
        if request.save is not None and request.nnodes == 1:  # on one machine every writer is known dead
            tidy(request.save)
        raise
    return 0


def check_eval_data(path: Path, specs: list[InputSpec], config: Any, micro_batch: MicroBatch, causal_lm: bool,
                    per_round: int) -> None:
    """The eval file is read as the data file is, and evaluation can weigh its micro-batches
    (partitioning/train/evaluate.py pads the last round with examples whose labels are ignored)."""
    dataset = read_dataset(path, specs, config, micro_batch, 1)
    check_learnable(dataset, specs, causal_lm, path)
    per_example = [spec.name for spec in specs if is_label(spec.name) and spec.shape == (BATCH,)]
    if dataset.count % per_round and per_example and getattr(config, "num_labels", None) == 1:
        raise UserError(f"--eval-data {path}: {dataset.count} examples do not fill rounds of {per_round}, and a "
                        f"one-label (regression) head's loss cannot ignore padding: give a multiple of {per_round}")


def epoch_steps(epochs: float, examples: int, per_step: int) -> int:
    """The steps ``epochs`` passes over ``examples`` take at ``per_step`` examples a step, said in one line: the
    count is rounded up, so every example is seen ``epochs`` times and the last step may reach into the next pass
    (a step's batch has the plan's fixed shape)."""
    needed = math.ceil(epochs * examples - 1e-9)  # 1e-9: a whole count that float arithmetic put just above it
    steps = max(1, math.ceil(needed / per_step))
    over = steps * per_step - needed
    beyond = f"; its last {over} examples come from the next pass" if over > 0 else ""
    print(f"{PROG}: --epochs {epochs:g} of {examples} examples at {per_step} a step: {steps} steps{beyond}",
          flush=True)
    return steps


def main(argv: list[str] | None = None) -> int:
    return run(PROG, parse, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
