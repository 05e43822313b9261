"""Run a plan's stages with ``torch.distributed.pipelining`` (one stage per rank), tied weights kept in sync.

The engine traces, splits, communicates and schedules; this module adapts a
plan and a generated model to it and covers what the engine does not do:

* every model input must be consumed by stage 0: a wrapper copies each input
  first, and later stages receive the copies as ordinary activations;
* tensors sent between stages must be contiguous (gloo rejects T5's permuted
  position bias), and a value needing a gradient may go to one later stage
  only (T5's encoder output feeds every decoder stage): see
  :mod:`partitioning.gpu.stage_graphs`;
* the loss is the model's own: its labels are inputs like any other (carried
  to the last stage), the last stage returns the loss, and the schedule's
  ``loss_fn`` passes it through.  So the pipeline computes exactly what the
  model does, for any number of label tensors;
* a parameter used by several stages (T5's shared embedding, the tied LM
  head) is replicated into each of them with gradients never combined: like
  DeepSpeed's ``TiedLayerSpec``, the copies start identical (broadcast from
  the first holder) and get the summed gradient after every backward (see
  :mod:`partitioning.gpu.tied`), so identical optimizer updates keep them equal;
* a value the plan has a stage recompute instead of receive (T5's position
  bias, its extended masks) is replayed there from the traced graph (see
  :mod:`partitioning.gpu.recompute_graph`): the parameters it reads become
  replicas kept equal like tied weights, and its gradient goes back to the
  stage that made it (:mod:`partitioning.gpu.gradient_return`).

With a device mesh ``(("dp", D), ("pp", K))`` the pipeline runs in each of D
replicas: stage traffic stays in the replica's ``pp`` group, each stage module
is wrapped in torch's ``DistributedDataParallel`` over its ``dp`` group (the
schedule lets it reduce in the last backward only), and a tied weight's
copies, left out of DDP, are summed over every replica's holders at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, SplitPoint
from torch.distributed.pipelining._IR import Pipe, annotate_split_points

from common.errors import UserError
from families.models import SharedWeight
from partitioning.gpu.recompute_graph import Recomputation, recompute_policy
from partitioning.gpu.stage_graphs import contiguous_boundaries, relay_shared_activations, sort_stage_inputs
from partitioning.gpu.tied import TiedCopy, holders, ordered_sum
from partitioning.plan import Plan

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
TIED_SUMS = ("ordered", "allreduce")
_PREFIX = "model."


class CarryInputs(nn.Module):
    """Calls ``model(**inputs)`` on copies of its inputs, made first so that they run in stage 0."""

    def __init__(self, model: nn.Module, input_names: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.input_names = tuple(input_names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        carried = [tensor.clone() for tensor in inputs]
        return self.model(**dict(zip(self.input_names, carried)))


def split_spec(plan: Plan, model: nn.Module, prefix: str = "") -> dict[str, SplitPoint]:
    """A split before the first module of every stage after the first."""
    plan.validate()
    first_module = {block.name: block.first_module for block in plan.blocks}
    spec = {}
    for stage in plan.stages[1:]:
        module = first_module[stage.blocks[0]]
        try:
            model.get_submodule(module)
        except AttributeError:
            raise UserError(f"stage {stage.index} starts at module {module!r}, which the model does not have") from None
        spec[prefix + module] = SplitPoint.BEGINNING
    return spec


class PipelineRun:
    """This rank's stage of a plan, its schedule, and the tied-weight synchronisation.

    ``tied_sum="ordered"`` (default) gives every copy of a tied weight the
    gradient single-process training computes, bit for bit, at the cost of
    keeping each use's gradient for every micro-batch of the step.
    ``tied_sum="allreduce"`` sums the copies' accumulated gradients with one
    all-reduce, as DeepSpeed does: no extra memory, equal up to the order of
    the float additions.

    ``materialize`` receives this rank's stage module before the engine builds
    its stage: a model traced on ``meta`` (``example`` on ``meta`` too) gets
    its values there, and only this stage's (:mod:`partitioning.train.stage`).

    ``mesh`` (dims ``"dp"``, ``"pp"``, ranks numbered replica-major) runs one
    replica of the pipeline per ``dp`` index, the replicas' gradients averaged.
    """

    def __init__(self, model: nn.Module, plan: Plan, example: dict[str, torch.Tensor], *, micro_batches: int,
                 schedule: str, device: torch.device | None = None, tied_sum: str = "ordered",
                 materialize: Callable[[nn.Module], None] | None = None, mesh: DeviceMesh | None = None) -> None:
        if not dist.is_initialized():
            raise UserError("torch.distributed is not initialized (launch with torchrun)")
        if schedule not in SCHEDULES:
            raise UserError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
        if tied_sum not in TIED_SUMS:
            raise UserError(f"unknown tied_sum {tied_sum!r}; known: {', '.join(TIED_SUMS)}")
        self.group = mesh.get_group("pp") if mesh is not None else dist.group.WORLD
        self.dp_group = mesh.get_group("dp") if mesh is not None else None
        self.replicas = mesh.size(0) if mesh is not None else 1
        self.rank, world = dist.get_rank(self.group), dist.get_world_size(self.group)
        if world != len(plan.stages):
            raise UserError(f"the plan has {len(plan.stages)} stages but {world} ranks run (one stage per rank)")
        if mesh is not None and mesh.mesh.flatten().tolist() != list(range(dist.get_world_size())):
            raise UserError("the device mesh must number its ranks replica-major (dp, pp)")
        if isinstance(model, SharedWeight):
            model.make_stateless()  # one shared Parameter, no module registered under two names
        self.input_names = tuple(example)
        self.stages, self.micro_batches, self.tied_sum = len(plan.stages), micro_batches, tied_sum
        # Every rank makes every group, in the same order: the plan is the same on all of them.
        # the gradient links' own group per replica (on the stages' group their messages would mix with the engine's)
        side = [dist.new_group(row) for row in (mesh.mesh.tolist() if mesh is not None else [list(range(world))])
                ][dist.get_rank() // world] if any(stage.recompute for stage in plan.stages) else None
        wrapped = CarryInputs(model, self.input_names)
        annotate_split_points(wrapped, split_spec(plan, model, _PREFIX))
        self.recomputation = Recomputation()
        # What torch.distributed.pipelining.pipeline() does, with the recompute rewrite before the split.
        pipe = Pipe.from_tracing(wrapped, tuple(example.values()),
                                 split_policy=recompute_policy(plan, _PREFIX, self.recomputation))
        for link in self.recomputation.links:
            link.group = side
        if pipe.num_stages != self.stages:
            raise UserError(f"the engine made {pipe.num_stages} stages of a {self.stages}-stage plan")
        device = device or torch.device("cpu")
        relay_shared_activations(pipe.split_gm)
        sort_stage_inputs(pipe.split_gm)
        holding = holders([pipe.get_stage_module(i) for i in range(self.stages)])
        self.module = pipe.get_stage_module(self.rank)
        self.others = [pipe.get_stage_module(i) for i in range(self.stages) if i != self.rank]
        if materialize is not None:
            materialize(self.module)
        contiguous_boundaries(self.module)
        self.stage = pipe.build_stage(self.rank, device, self.group)
        self.schedule = SCHEDULES[schedule](self.stage, micro_batches, loss_fn=model_loss)
        # The engine splits a target per micro-batch for loss_fn; the loss needs none (the labels are inputs).
        self._placeholder = torch.zeros(micro_batches, device=device)
        self.tied = self._tie(holding)
        if self.tied and tied_sum == "ordered":
            self.module.register_forward_hook(self._watch)
        if self.dp_group is not None:
            self._data_parallel(device)

    def _data_parallel(self, device: torch.device) -> None:
        """DDP over this stage's replicas; tied copies are left to :meth:`sync_tied_gradients`."""
        from torch.nn.parallel import DistributedDataParallel

        class StageDDP(DistributedDataParallel):
            @property
            def graph(self) -> torch.fx.Graph:  # the engine reads its stage module's graph (the traced frontend)
                return self.module.graph

        tied = [copy.name for copy in self.tied]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(self.module, tied)
        if any(p.requires_grad for name, p in self.module.named_parameters() if name not in tied):
            # the engine sees DDP and runs every backward but a step's last under no_sync()
            self.stage.submod = StageDDP(
                self.module, process_group=self.dp_group, broadcast_buffers=False,
                device_ids=[device] if device.type == "cuda" else None)

    def _watch(self, module: nn.Module, args: object, outputs: object) -> None:
        for copy in self.tied:  # returns None: a forward hook's result would replace the outputs
            copy.watch(outputs)

    def _tie(self, holders: dict[str, tuple[int, ...]]) -> list[TiedCopy]:
        copies = []
        local = dict(self.module.named_parameters())
        pp = self.stages
        for name, stages in sorted(holders.items()):
            # every rank takes part in creating every group; global rank = replica * stages + stage
            group = dist.new_group(sorted(d * pp + s for d in range(self.replicas) for s in stages))
            if self.rank in stages:
                parameter = local[name]
                with torch.no_grad():
                    dist.broadcast(parameter.data, group=group, group_src=0)
                copies.append(TiedCopy(name, stages, parameter, group, self.replicas))
        return copies

    def step(self, inputs: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """One pipelined forward and backward of a whole batch (labels included: stage 0 reads ``inputs``).

        The last stage returns each micro-batch's loss.
        """
        losses: list[torch.Tensor] = []
        args = tuple(inputs[name] for name in self.input_names) if self.rank == 0 and inputs is not None else ()
        last = self.rank == self.stages - 1
        self.schedule.step(*args, target=self._placeholder if last else None, losses=losses if last else None,
                           return_outputs=False)
        for link in self.recomputation.links:
            link.finish()
        self.sync_tied_gradients()
        return losses

    def sync_tied_gradients(self) -> None:
        """Give every copy of a tied weight the gradient of the one weight it stands for."""
        for copy in self.tied:
            if copy.parameter.grad is None:
                if self.rank not in self.recomputation.replayed:
                    raise UserError(f"stage {self.rank} holds {copy.name} but computed no gradient for it")
                # a replica read only to recompute a value (outside autograd) contributes nothing itself
                copy.parameter.grad = torch.zeros_like(copy.parameter)
            if self.tied_sum == "allreduce":
                dist.all_reduce(copy.parameter.grad, group=copy.group)
                if self.replicas > 1:
                    copy.parameter.grad.div_(self.replicas)  # as DDP averages the other parameters
            else:
                total = ordered_sum(copy, self.micro_batches)
                # the schedule divided the copy's own gradient by the micro-batch count, DDP the others' by the
                # replica count: so does the sum
                count = self.micro_batches * self.replicas if self.schedule.scale_grads else self.replicas
                copy.parameter.grad.copy_(total / count if count > 1 else total)


def model_loss(output: torch.Tensor, placeholder: torch.Tensor) -> torch.Tensor:
    """The schedule's ``loss_fn``: the last stage's output already is the model's loss."""
    if output.dim() != 0:
        raise UserError(f"the last stage returns a {list(output.shape)} tensor, not a loss: pipelined training "
                        f"needs a class that computes its loss, given its labels as inputs")
    return output
