"""One rank of ``train-model`` (started by torchrun): its stage, the data, AdamW, clipping, logging, saving.

Step by step it does what one process would: forward and backward of the
step's micro-batches, the gradients divided by their count, clipping by the
global norm, ``optimizer.step()``, ``scheduler.step()``, ``zero_grad()``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from common.cli import report
from common.errors import UserError
from common.memory import return_large_frees
from partitioning.files import read_plan
from partitioning.gpu.train import device_for_rank
from partitioning.train.data import read_dataset
from partitioning.train.evaluate import evaluate, rounds
from partitioning.train.layout import METRICS
from partitioning.train.loss_scale import LossScale
from partitioning.train.metrics import MetricsLog, peak_memory
from partitioning.train.optim import OptimizerSettings, exempt_from_decay, make_optimizer
from partitioning.train.request import PROG, Request, kept_settings, parse, settings_text
from partitioning.train.save import checkpoint_dir, prune, read_state, restore, save, training_state
from partitioning.train.stage import StageModel, load_stage


def train(request: Request, device: torch.device) -> StageModel:
    if request.data is None:  # train-model packs --text into a data file before it starts the ranks
        raise UserError("a rank reads --data FILE: start runs with train-model")
    steps = request.steps
    if steps is None:  # train-model turns --epochs into steps before it starts the ranks
        raise UserError("a rank trains --steps N: start runs with train-model")
    plan = read_plan(request.plan)
    stages = len(set(plan.ranks))  # ranks per pipeline (a rank may run several of the plan's stages)
    replicas = request.data_parallel
    state = read_state(request.resume, stages, replicas) if request.resume is not None else None
    began = time.perf_counter()
    stage = load_stage(plan, request.resume or request.checkpoint, device, request.micro_batches,  # type: ignore[arg-type]
                       replicas, request.models_dir, request.tied_sum, request.dtype, request.config_from_checkpoint)
    if dist.get_rank() == 0:  # what the first step waits for, said before it (a large stage loads for a while)
        print(f"loaded stage 0's {len(stage.loaded)} tensors in {time.perf_counter() - began:.1f} s; step "
              f"{(state or {}).get('step', 0) + 1} starts on {dist.get_world_size()} ranks", flush=True)
    torch.manual_seed(request.seed + dist.get_rank())  # each rank's own stream (dropout): saved and restored
    size = stage.micro_batch.batch * stage.micro_batches * replicas  # a step's examples, all replicas together
    data = (read_dataset(request.data, stage.specs, stage.config, stage.micro_batch, size)
            if stage.rank == 0 else None)
    eval_count, eval_batches = 0, None
    if request.eval_data is not None:  # refused before the first step, not at the first evaluation
        stage.run.check_evaluable()
        eval_set = (read_dataset(request.eval_data, stage.specs, stage.config, stage.micro_batch, 1)
                    if stage.rank == 0 else None)
        shared = [eval_set.count if eval_set is not None else 0]
        dist.broadcast_object_list(shared, src=0)  # the last stages weigh their losses by it
        eval_count = shared[0]
        eval_batches = rounds(eval_set, size) if eval_set is not None else None
    settings = OptimizerSettings(lr=request.lr, weight_decay=request.weight_decay, betas=request.betas,
                                 eps=request.eps, warmup=request.warmup_steps, decay=request.decay,
                                 total=request.decay_steps or steps, decay_all=request.decay_all_parameters)
    exempt = exempt_from_decay(stage.meta.model, stage.meta.stock_name)  # stock names, read off the whole model
    optimizer, scheduler = make_optimizer(stage.module.named_parameters(),
                                          {name for name, stock in stage.names.items() if stock in exempt}, settings)
    names = list(stage.names.values())
    loss_scale = LossScale(device, request.loss_scale) if request.dtype == "fp16" else None
    if loss_scale is not None:
        stage.run.scale_loss = loss_scale.scale
    start = 0
    if state is not None:
        assert request.resume is not None
        restore(request.resume, stage.rank, optimizer, scheduler, names, stage.parameters(), stage.replica,
                loss_scale)
        start = state["step"]
    tokens = size * sum(stage.micro_batch.lengths.values())
    last = stage.run.last  # this rank holds the last stage: it gets the losses
    reporter = last and stage.replica == 0
    metrics = MetricsLog(request.save, request.tensorboard, request.resume, start) if reporter else None
    run_began = time.perf_counter()
    echoed = request.echo_settings.read_text(encoding="utf-8") if request.echo_settings else settings_text(request)
    try:
        for step in range(start, steps):
            began = time.perf_counter()
            batch = stage.shard(data.batch(step, size, request.seed)) if data is not None else None
            losses = stage.step(batch)
            done = step + 1
            check_finite(stage, losses, done, gradients=loss_scale is None)  # fp16: an overflow skips the step
            scale = loss_scale.value if loss_scale is not None else None
            if loss_scale is not None:
                loss_scale.unscale(optimizer)
            norm = stage.clip_grad_norm_(request.clip_grad) if request.clip_grad is not None else None
            lr = scheduler.get_last_lr()[0]
            if loss_scale is not None:
                skipped = not loss_scale.step(optimizer, scheduler)
            else:
                optimizer.step()
                scheduler.step()
                skipped = False
            optimizer.zero_grad()
            seconds = time.perf_counter() - began  # the step's, evaluation apart
            evaluated = request.eval_data is not None and (
                done == steps or (request.eval_every is not None and done % request.eval_every == 0))
            eval_loss = evaluate(stage, eval_batches, eval_count) if evaluated else None
            if done % request.log_every == 0 or done == steps or evaluated:
                now = time.perf_counter()
                eta = (now - run_began) / (done - start) * (steps - done)  # this run's mean step so far
                report_step(stage, losses, metrics, {"step": done, "lr": lr, "grad_norm": norm, "tokens": tokens,
                                                     "seconds": seconds, "eta": eta, "loss_scale": scale,
                                                     "skipped": skipped, "eval_loss": eval_loss,
                                                     "eval_examples": eval_count}, steps)
            if request.save is not None and (done == steps or
                                             (request.save_every is not None and done % request.save_every == 0)):
                run_state = {"step": done, "examples_seen": done * size, "stages": stage.stages,
                             **kept_settings(request, plan, stage.micro_batches)}
                limit = request.save_total_limit
                kept = limit is not None and done != steps  # into a checkpoint-<step>/
                target = checkpoint_dir(request.save, done) if kept else request.save
                saving = time.perf_counter()
                save(stage, target, training_state(optimizer, scheduler, names, loss_scale), run_state,
                     stage.checkpoint,
                     echoed, metrics=request.save / METRICS if kept else None)
                if limit is not None and kept and dist.get_rank() == 0:
                    prune(request.save, limit)
                if reporter:
                    print(f"saved step {done} to {target} in {time.perf_counter() - saving:.1f} s", flush=True)
    finally:
        if metrics is not None:
            metrics.close()
    return stage


def report_step(stage: StageModel, losses: list[torch.Tensor], metrics: MetricsLog | None, step: dict[str, Any],
                steps: int) -> None:
    """A logged step (every rank of the run takes part): the mean loss over every replica's micro-batches and
    each stage's peak memory, printed and recorded by the first replica's last stage."""
    peak = peak_memory(stage.device)
    peaks: list[Any] = [None] * stage.stages
    dist.all_gather_object(peaks, peak, group=stage.group)
    if not stage.run.last:
        return
    mean = torch.stack([value.detach() for value in losses]).mean()
    if stage.replicas > 1:  # the mean over every replica's micro-batches (the last stages' group)
        dist.all_reduce(mean, group=stage.run.dp_group)
    if stage.replica != 0:
        return
    loss, seconds = mean.item() / stage.replicas, step["seconds"]
    eta = "" if step["step"] == steps else f", {_duration(step['eta'])} to go"
    evaluated = step["eval_loss"] is not None
    shown = f", eval loss {step['eval_loss']:.4f}" if evaluated else ""
    if step["skipped"]:  # what the optimizer did not do is said where the step is
        shown += f", skipped: the gradients overflowed at loss scale {step['loss_scale']:g} (now halved)"
    print(f"step {step['step']}/{steps}: loss {loss:.4f}, {step['tokens'] / seconds:.0f} tokens/s, "
          f"lr {step['lr']:.3g}{shown}{eta}", flush=True)
    if metrics is not None:
        norm = step["grad_norm"] if not step["skipped"] else None  # an overflowed norm is inf or NaN: no JSON
        scaled = step["loss_scale"] is not None
        metrics.log({"step": step["step"], "loss": loss, "lr": step["lr"],
                     **({"grad_norm": norm.item()} if norm is not None else {}),
                     **({"loss_scale": step["loss_scale"], "skipped": step["skipped"]} if scaled else {}),
                     "tokens_per_s": step["tokens"] / seconds, "seconds": seconds,
                     "peak_memory_bytes": [used for used, _ in peaks], "memory": peak[1],
                     **({"eval_loss": step["eval_loss"], "eval_examples": step["eval_examples"]} if evaluated else {})})


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


def check_finite(stage: StageModel, losses: list[torch.Tensor], done: int, gradients: bool = True) -> None:
    """Stop every rank of the run in one line when step ``done``'s loss or (``gradients``) gradient norm is not
    finite: before its optimizer step, so nothing of it is trained or saved (a collective over every rank; the
    last save stays).  Under a loss scale an overflowed gradient is no error: that step is skipped."""
    bad = torch.zeros(4, device=stage.device)  # loss NaN, loss infinite, gradient norm NaN, gradient norm infinite
    if losses:
        values = torch.stack([value.detach().float() for value in losses])
        bad[0], bad[1] = values.isnan().any(), values.isinf().any()
    grads = [p.grad for p in stage.parameters() if p.grad is not None] if gradients else []
    if grads:
        norms = torch.stack(torch._foreach_norm(grads, 2.0)).float()
        bad[2], bad[3] = norms.isnan().any(), norms.isinf().any()
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if bool(bad.any()):
        what = ["the loss is NaN", "the loss is infinite", "the gradient norm is NaN", "the gradient norm is infinite"]
        causes = " and ".join(text for text, flag in zip(what, bad.tolist()) if flag)
        raise UserError(f"step {done}: {causes} (a micro-batch whose labels are all -100, a learning rate that "
                        f"diverged): stopped before its optimizer step, nothing of it saved")


def main(argv: list[str] | None = None) -> int:
    # A rank keeps the default SIGTERM, so one blocked in a collective dies when torchrun stops it.
    prog = f"{PROG} (rank {os.environ.get('RANK', '0')})"
    try:
        request = parse(argv)
    except UserError as exc:
        return report(prog, exc)
    return_large_frees()  # before any tensor: glibc would keep freed activations resident (see memory.py)
    backend, device = device_for_rank()
    dist.init_process_group(backend)
    try:
        train(request, device)
    except (UserError, OSError) as exc:
        return report(prog, exc)
    except Exception as exc:  # noqa: BLE001 (a rank's unforeseen failure is still one line naming the rank)
        return _internal(prog, exc, request)
    finally:
        dist.destroy_process_group()
    return 0


def _internal(prog: str, exc: Exception, request: Any) -> int:
    if request.verbose:
        import traceback

        traceback.print_exc()
    print(f"{prog}: error: internal error: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
