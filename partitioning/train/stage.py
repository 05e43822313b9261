"""This rank's stage of a plan, built from a stock checkpoint: traced and split on ``meta``, then only it is loaded.

:func:`load_stage` is the Python API for users who keep their own loop::

    stage = load_stage(read_plan(path), Path("my-t5"))   # under torchrun, one rank per stage
    optimizer = torch.optim.AdamW(stage.parameters(), lr=1e-4)
    for batch in batches:                                   # rank 0 passes the inputs, the others None
        losses = stage.step(batch)                          # the last stage gets the micro-batch losses
        stage.clip_grad_norm_(1.0)                          # the global norm, as in one process
        optimizer.step(); optimizer.zero_grad()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from common.errors import UserError
from families.checkpoint import Checkpoint
from families.definition import InputSpec
from families.family import ModelFamily, trained_model
from families.loading import MetaModel, build_meta, check_checkpoint, checkpoint_config, materialize
from families.models import MicroBatch, make_inputs
from partitioning.gpu.autocast import DTYPES
from partitioning.gpu.pipelining import PipelineRun
from partitioning.plan import Plan
from partitioning.settings import Settings
from stateless.torch_internals import foreach_norms, new_group

PREFIX = "model."  # the stage modules' names: PipelineRun wraps the model as ``model``


def plan_model(plan: Plan, models_dir: Path | None = None) -> tuple[ModelFamily, str, Any, list[InputSpec], MicroBatch]:
    """The family, class, config, inputs and micro-batch the plan was made for (a stale plan is refused)."""
    return trained_model(plan.model, models_dir)


def settings_of(plan: Plan, micro_batches: int | None = None) -> tuple[int, str]:
    """The micro-batch count (the plan's unless given) and the schedule of a run of ``plan``."""
    settings = Settings.from_plan(plan.settings)
    return micro_batches or settings.micro_batches, settings.schedule


class StageModel:
    """One rank's stage: its module (loaded from the checkpoint), the pipeline step, and global-norm clipping."""

    def __init__(self, plan: Plan, checkpoint: Checkpoint, *, device: torch.device | None = None,
                 micro_batches: int | None = None, data_parallel: int = 1, models_dir: Path | None = None,
                 tied_sum: str | None = None, dtype: str = "fp32", config_from_checkpoint: bool = False) -> None:
        self.family, self.class_name, self.config, self.specs, self.micro_batch = plan_model(plan, models_dir)
        self.config, _ = checkpoint_config(self.config, checkpoint, self.family, self.class_name,
                                           config_from_checkpoint)  # the model is the checkpoint's
        self.version = str(plan.model["version"])
        self.micro_batches, self.schedule = settings_of(plan, micro_batches)
        self.meta: MetaModel = build_meta(self.family, self.class_name, self.config)
        check_checkpoint(self.meta, checkpoint, self.family, self.class_name, self.config)
        self.checkpoint, self.device = checkpoint, device or torch.device("cpu")
        example = {k: v.to("meta") for k, v in make_inputs(self.specs, self.config, self.micro_batch, "cpu").items()}
        self.run = PipelineRun(self.meta.model, plan, example, micro_batches=self.micro_batches,
                               schedule=self.schedule, device=self.device, materialize=self._materialize,
                               tied_sum=tied_sum or Settings.from_plan(plan.settings).tied_sum,
                               autocast=DTYPES[dtype],
                               mesh=_mesh(data_parallel, len(set(plan.ranks)), self.device))
        self.module: nn.Module = self.run.module
        self.loaded = list(checkpoint.loaded)  # the keys this rank read to build its stage
        self.rank, self.stages = self.run.rank, self.run.stages  # the rank in its pipeline, the ranks per pipeline
        self.group, self.replicas = self.run.group, self.run.replicas
        self.replica = dist.get_rank() // self.stages  # ranks are numbered replica-major
        # stock name of each parameter this rank holds; tied copies count once, at their first holder (chunk)
        self.names = {name: self.meta.stock_name(self.stateless(name)) for name, _ in self.module.named_parameters()}
        self.owned = {name for name in self.names
                      if self._chunk(name) == min(self.run.holding.get(self._in_chunk(name), [self._chunk(name)]))}

    def _in_chunk(self, name: str) -> str:
        """A name of :attr:`module` as its chunk's module names it (with several chunks they sit under ``<i>.``)."""
        return name.split(".", 1)[1] if len(self.run.chunks) > 1 else name

    def _chunk(self, name: str) -> int:
        return self.run.chunks[int(name.split(".", 1)[0])] if len(self.run.chunks) > 1 else self.run.chunks[0]

    def stateless(self, name: str) -> str:
        """The stateless model's name of a parameter or buffer of :attr:`module` (what ``meta.keys`` maps)."""
        return self._in_chunk(name).removeprefix(PREFIX)

    def _materialize(self, module: nn.Module) -> None:
        """Give the stage its own tensors, from the checkpoint (buffers it lacks: their built values)."""
        materialize(module, self.meta, self.checkpoint, self.device, f"stage {dist.get_rank()}", PREFIX)

    def parameters(self) -> list[nn.Parameter]:
        return list(self.module.parameters())

    def named_parameters(self) -> dict[str, nn.Parameter]:
        """This stage's parameters by stock name (a tied copy under its first stock name)."""
        return {self.names[name]: p for name, p in self.module.named_parameters()}

    def shard(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This replica's rows of a whole step's batch (replica ``d`` takes the ``d``-th equal slice)."""
        return {key: value.tensor_split(self.replicas)[self.replica] for key, value in batch.items()}

    def step(self, inputs: dict[str, torch.Tensor] | None) -> list[torch.Tensor]:
        """Forward and backward of one batch of ``micro_batches`` micro-batches; the last stage gets the losses."""
        if self.rank == 0 and inputs is not None:
            inputs = {key: value.to(self.device) for key, value in inputs.items()}
        return self.run.step(inputs)

    def evaluate(self, inputs: dict[str, torch.Tensor] | None) -> list[torch.Tensor]:
        """Forward only, as in eval mode, of one batch of ``micro_batches`` micro-batches; the last stage gets the
        losses (:meth:`partitioning.gpu.pipelining.PipelineRun.evaluate`)."""
        if self.rank == 0 and inputs is not None:
            inputs = {key: value.to(self.device) for key, value in inputs.items()}
        return self.run.evaluate(inputs)

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the whole model: same norm, same scaling, bit for bit.

        Each parameter's norm is taken once (a tied weight at its first holder),
        every rank stacks them all in the stock model's parameter order, and
        scales its gradients by the same factor.
        """
        grads = {self.names[name]: p.grad for name, p in self.module.named_parameters()
                 if name in self.owned and p.grad is not None}
        local = list(grads.values())
        norms = foreach_norms(local)
        if norms is None:
            norms = [torch.linalg.vector_norm(g, 2.0) for g in local]
        mine = {name: norm.cpu() for name, norm in zip(grads, norms)}
        everyone: list[dict[str, torch.Tensor] | None] = [None] * self.stages
        dist.all_gather_object(everyone, mine, group=self.group)  # replicas hold the same (averaged) gradients
        found = {name: norm for part in everyone if part for name, norm in part.items()}
        order = [self.meta.stock_name(name) for name in self.meta.order]
        # Stacked where the gradients are, as stock stacks on their device: a norm over the same values on CPU
        # and on CUDA can differ in its last bit.
        stacked = torch.stack([found[name].to(self.device) for name in order if name in found])
        total = torch.linalg.vector_norm(stacked, 2.0)
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        with torch.no_grad():
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(coefficient.to(p.grad.device))
        return total


def _mesh(replicas: int, stages: int, device: torch.device) -> DeviceMesh | None:
    """The ``(("dp", replicas), ("pp", stages))`` mesh of a data-parallel run (global rank = replica * stages + stage)."""
    if replicas == 1:
        return None
    if dist.get_world_size() != replicas * stages:
        raise UserError(f"{replicas} replicas of {stages} stages need {replicas * stages} ranks, not "
                        f"{dist.get_world_size()}")
    # every rank creates every group, in one order, as it does the tied-weight groups that follow
    layout = torch.arange(replicas * stages).reshape(replicas, stages)
    rank = dist.get_rank()
    dp = [new_group(column.tolist()) for column in layout.T]
    pp = [new_group(row.tolist()) for row in layout]
    replica, stage = divmod(rank, stages)
    column, row = dp[stage], pp[replica]
    assert column is not None and row is not None, rank  # the rank's own column and row
    return DeviceMesh.from_group([column, row], device.type, layout, mesh_dim_names=("dp", "pp"))


def load_stage(plan: Plan, checkpoint: Path, device: torch.device | None = None,
               micro_batches: int | None = None, data_parallel: int = 1, models_dir: Path | None = None,
               tied_sum: str | None = None, dtype: str = "fp32", config_from_checkpoint: bool = False) -> StageModel:
    """This rank's stage of ``plan`` with its weights from the HF model directory ``checkpoint``.

    ``data_parallel`` replicas of the pipeline run on as many times the plan's stages in ranks;
    each replica's stage 0 passes its share of the batch (see :meth:`StageModel.shard`).
    ``tied_sum``: how the copies of a weight several stages hold get their gradient
    (:class:`partitioning.gpu.pipelining.PipelineRun`); ``dtype="bf16"``: forwards under bf16 autocast;
    ``config_from_checkpoint``: config fields the checkpoint has otherwise than the plan are taken from it
    (:func:`families.loading.checkpoint_config`; without it they are refused).
    """
    return StageModel(plan, Checkpoint(checkpoint), device=device, micro_batches=micro_batches,
                      data_parallel=data_parallel, models_dir=models_dir, tied_sum=tied_sum, dtype=dtype,
                      config_from_checkpoint=config_from_checkpoint)
