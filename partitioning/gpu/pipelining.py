"""Run a plan's stages with ``torch.distributed.pipelining`` on any of its schedules, tied weights kept in sync.

The engine traces, splits, communicates and schedules; this module adapts a
plan and a generated model to it and covers what the engine does not do:

* every model input must be consumed by stage 0: a wrapper copies each input
  first, and later stages receive the copies as ordinary activations;
* tensors sent between stages must be contiguous (gloo rejects T5's permuted
  position bias), and a value needing a gradient may go to one later stage
  only (T5's encoder output feeds every decoder stage): see
  :mod:`partitioning.gpu.stage_graphs`, which also passes every value along
  the chain, stage to stage, as the multi-stage schedules need;
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
  stage that made it (:mod:`partitioning.gpu.gradient_return`);
* a plan of K x V chunks (``settings.virtual_stages``) runs V chunks per
  rank where ``plan.placement`` puts them, which must be where the schedule
  puts them (the engine's own mapping, :mod:`partitioning.schedules`);
  the schedule class is the engine's, by the plan's schedule name.  Zero-bubble
  schedules split a backward into its input-gradient part (I) and its
  weight-gradient part (W) with the engine's own ``stage_backward_input`` /
  ``stage_backward_weight``, except in a chunk that returns or receives a
  recomputed value's gradient (the engine's W re-runs the graph nodes where
  weight and input paths meet, and a gradient message must go exactly once,
  before the receiving chunk needs it) or that sends a value made from its
  weights alone (whose gradient the engine's split loses in part,
  :func:`weight_only_senders`): such a chunk runs its whole backward in
  I (the engine's ``dw_builder`` hook) and W does nothing.

With a device mesh ``(("dp", D), ("pp", K))`` the pipeline runs in each of D
replicas: stage traffic stays in the replica's ``pp`` group (ranks here are
that group's), each chunk module is wrapped in torch's ``DistributedDataParallel``
over its ``dp`` group (the schedule lets it reduce in the last backward only), and a
tied weight's copies, left out of DDP, are summed over every replica's holders at
once.  Schedules that split a backward (zero bubble) are refused with D > 1.
``autocast`` (a dtype): every chunk's forward under ``torch.autocast``, traced under
it too (:mod:`partitioning.gpu.autocast`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import Pipe, SplitPoint
from torch.distributed.pipelining import schedules as engine

from common.errors import UserError
from families.models import SharedWeight
from partitioning.gpu.autocast import example_without_meta, move, on_meta, to_meta, under_autocast, without_data
from partitioning.gpu.data_parallel import data_parallel
from partitioning.gpu.eval_mode import evaluating, switchable
from partitioning.gpu.recompute_graph import Recomputation, recompute_policy
from partitioning.gpu.schedule_stages import (
    check_placement,
    full_backward_in_input_step,
    no_self_warmup,
    weight_groups_share_nodes,
    weight_only_senders,
)
from partitioning.gpu.shared_modules import copy_stateless_leaves
from partitioning.gpu.stage_graphs import (
    contiguous_boundaries,
    relay_along_chain,
    retarget_devices,
    sort_stage_inputs,
    stage_routes,
)
from partitioning.gpu.tied import holders
from partitioning.gpu.tied_sync import TiedWeights
from partitioning.plan import Plan
from partitioning.schedules import SINGLE, orders, streams
from partitioning.settings import TIED_SUMS
from stateless.torch_internals import annotate_split_points, new_group

_PREFIX = "model."
_EVAL_TAG = 7  # evaluate()'s messages: a tag of their own, apart from the engine's


class CarryInputs(nn.Module):
    """Calls ``model(**inputs)`` on copies of its inputs, made first so that they run in stage 0."""

    def __init__(self, model: nn.Module, input_names: Sequence[str]) -> None:
        super().__init__()
        copy_stateless_leaves(model)  # the engine's trace needs one path per module (shared_modules.py)
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
    """This rank's stages (chunks) of a plan, their schedule, and the tied-weight synchronisation.

    ``tied_sum="ordered"`` (default) gives every copy of a tied weight the
    gradient single-process training computes, bit for bit: summed as the
    backward runs where the schedule allows (GPipe, 1F1B, Interleaved1F1B:
    :mod:`partitioning.gpu.tied_stream`), else after it, at the cost of
    keeping each use's gradient for every micro-batch of the step.
    ``tied_sum="allreduce"`` sums the copies' accumulated gradients with one
    all-reduce, as DeepSpeed does: no extra memory, equal up to the order of
    the float additions.

    ``materialize`` receives each of this rank's stage modules before the
    engine builds its stage: a model traced on ``meta`` (``example`` on
    ``meta`` too) gets its values there, and only this rank's.

    ``module`` is this rank's stage module (an ``nn.ModuleList`` of its
    chunks where it runs several: ``chunk_modules``); ``stages`` the number
    of ranks; ``last``: this rank holds the last chunk (it gets the losses).

    ``mesh`` (dims ``"dp"``, ``"pp"``, ranks numbered replica-major) runs one
    replica of the pipeline per ``dp`` index, the replicas' gradients averaged.
    """

    def __init__(self, model: nn.Module, plan: Plan, example: dict[str, torch.Tensor], *, micro_batches: int,
                 schedule: str, device: torch.device | None = None, tied_sum: str = "ordered",
                 materialize: Callable[[nn.Module], None] | None = None, mesh: DeviceMesh | None = None,
                 autocast: torch.dtype | None = None) -> None:
        if not dist.is_initialized():
            raise UserError("torch.distributed is not initialized (launch with torchrun)")
        if tied_sum not in TIED_SUMS:
            raise UserError(f"unknown tied_sum {tied_sum!r}; known: {', '.join(TIED_SUMS)}")
        self.group = mesh.get_group("pp") if mesh is not None else dist.group.WORLD
        self.dp_group = mesh.get_group("dp") if mesh is not None else None
        self.replicas = mesh.size(0) if mesh is not None else 1
        self.rank, world = dist.get_rank(self.group), dist.get_world_size(self.group)
        virtual = check_placement(plan, schedule, world, micro_batches)
        if mesh is not None and mesh.mesh.flatten().tolist() != list(range(dist.get_world_size())):
            raise UserError("the device mesh must number its ranks replica-major (dp, pp)")
        if self.replicas > 1 and splits_backward(schedule, world, virtual, micro_batches):
            raise UserError(f"data parallelism runs schedules that do not split the backward: {schedule} does")
        if isinstance(model, SharedWeight):
            model.make_stateless()  # one shared Parameter, no module registered under two names
        self.input_names = tuple(example)
        self.ranks_of = plan.ranks  # chunk -> rank
        self.stages, self.micro_batches, self.tied_sum = world, micro_batches, tied_sum
        chunk_count = len(plan.stages)
        self.chunks = [c for c, r in enumerate(self.ranks_of) if r == self.rank]
        self.last = chunk_count - 1 in self.chunks
        # Every rank makes every group, in the same order: the plan is the same on all of them.
        # the gradient links' own group per replica (on the stages' group their messages would mix with the engine's)
        side = [new_group(row) for row in (mesh.mesh.tolist() if mesh is not None else [list(range(world))])
                ][dist.get_rank() // world] if any(stage.recompute for stage in plan.stages) else None
        wrapped = CarryInputs(model, self.input_names)
        annotate_split_points(wrapped, split_spec(plan, model, _PREFIX))
        self.recomputation = Recomputation()
        device = device or torch.device("cpu")
        meta = autocast is not None and on_meta(model)
        if meta:  # autocast leaves meta tensors alone: trace on data-less ones (partitioning.gpu.autocast)
            move([model], without_data(device.type))
            example = example_without_meta(example, device.type)
        # What torch.distributed.pipelining.pipeline() does, with the recompute rewrite before the split.
        with torch.autocast(device.type, dtype=autocast) if autocast is not None else contextlib.nullcontext():
            pipe = Pipe.from_tracing(wrapped, tuple(example.values()),
                                     split_policy=recompute_policy(plan, _PREFIX, self.recomputation))
        if meta:
            move([model, *(pipe.get_stage_module(i) for i in range(pipe.num_stages))], to_meta)
        for tag, link in enumerate(self.recomputation.links):
            link.connect(side, self.ranks_of[link.sender], self.ranks_of[link.receiver], tag)
        if pipe.num_stages != chunk_count:
            raise UserError(f"the engine made {pipe.num_stages} stages of a {chunk_count}-stage plan")
        relay_along_chain(pipe.split_gm)
        sort_stage_inputs(pipe.split_gm)
        self.routes = stage_routes(pipe.split_gm)  # what evaluate() hands from chunk to chunk
        self.holding = holding = holders([pipe.get_stage_module(i) for i in range(chunk_count)])
        self.chunk_modules = [pipe.get_stage_module(c) for c in self.chunks]
        self.module = self.chunk_modules[0] if virtual == 1 else nn.ModuleList(self.chunk_modules)
        self.others = [pipe.get_stage_module(i) for i in range(chunk_count) if i not in self.chunks]
        splits = splits_backward(schedule, world, virtual, micro_batches)
        for module in self.chunk_modules:
            if materialize is not None:
                materialize(module)
            retarget_devices(module, device)
            contiguous_boundaries(module, copy=splits)
            if autocast is not None:
                under_autocast(module, device.type, autocast)
        # the random nodes evaluate() cannot run as eval mode would (none: evaluation is possible)
        self.unswitchable = [found for module in self.chunk_modules for found in switchable(module)]
        self.chunk_stages = [pipe.build_stage(c, device, self.group) for c in self.chunks]
        for stage in self.chunk_stages:
            no_self_warmup(stage)
        self.stage = self.chunk_stages[0]
        linked = {end for link in self.recomputation.links for end in (link.sender, link.receiver)}
        weight_only = weight_only_senders(plan)
        for chunk, stage in zip(self.chunks, self.chunk_stages):
            if splits and (chunk in linked or chunk in weight_only):
                stage.dw_builder = full_backward_in_input_step
            elif splits:
                weight_groups_share_nodes(stage)
        cls = engine.get_schedule_class(schedule)
        # what the backward starts from: the loss, or the loss times a scale (fp16's, partitioning/train/loss_scale.py)
        self.scale_loss: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._losses: list[torch.Tensor] = []  # each micro-batch's loss as the model returned it, unscaled
        self.schedule = cls(self.stage if schedule in SINGLE else self.chunk_stages, micro_batches, loss_fn=self._loss)
        # The engine splits a target per micro-batch for loss_fn; the loss needs none (the labels are inputs).
        self._placeholder = torch.zeros(micro_batches, device=device)
        self.tied_weights = TiedWeights(holding, self.chunks, self.chunk_modules, self.ranks_of, world, self.replicas,
                                        tied_sum)
        self.tied = self.tied_weights.copies
        self.tied_weights.watch(self.chunks, self.chunk_modules, self.chunk_stages, micro_batches, schedule,
                                streams(schedule, world, virtual, micro_batches, self.replicas))
        for stage, module in zip(self.chunk_stages, self.chunk_modules) if self.dp_group is not None else ():
            data_parallel(stage, module, [copy.name for copy in self.tied], self.dp_group, device)  # type: ignore[arg-type]

    def step(self, inputs: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """One pipelined forward and backward of a whole batch (labels included: rank 0 reads ``inputs``).

        The rank holding the last chunk returns each micro-batch's loss.
        """
        self._losses = []
        args = tuple(inputs[name] for name in self.input_names) if 0 in self.chunks and inputs is not None else ()
        self.schedule.step(*args, target=self._placeholder if self.last else None, return_outputs=False)
        for link in self.recomputation.links:
            link.finish()
        self.sync_tied_gradients()
        return self._losses

    def _loss(self, output: torch.Tensor, placeholder: torch.Tensor) -> torch.Tensor:
        """The schedule's ``loss_fn``: the model's loss, scaled where :attr:`scale_loss` says (the backward starts
        from what it returns; :meth:`step` returns the losses as the model computed them)."""
        loss = model_loss(output, placeholder)
        self._losses.append(loss)
        return loss if self.scale_loss is None else self.scale_loss(loss)

    def check_evaluable(self) -> None:
        """:meth:`evaluate` can run this rank's chunks as eval mode would (every random node a dropout)."""
        if self.unswitchable:
            raise UserError(f"evaluation would run in train mode: {', '.join(self.unswitchable[:3])} draws random "
                            f"numbers eval mode would not (a layer drop: set its probability to 0)")

    def evaluate(self, inputs: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Forward only, as in eval mode (no dropout, no autograd graph), of one batch of ``micro_batches``
        micro-batches split as :meth:`step` splits them; the rank holding the last chunk returns each one's loss.

        The engine's schedules keep a forward's state for its backward; here each micro-batch goes through the
        chunks in order, each rank running its own and handing the outputs on (:attr:`routes`), so the
        optimizer, the gradients and every random stream stay as the training steps leave them.
        """
        self.check_evaluable()
        chunks = {chunk: module for chunk, module in zip(self.chunks, self.chunk_modules)}
        split = ([value.tensor_split(self.micro_batches) for value in (inputs[n] for n in self.input_names)]
                 if 0 in chunks and inputs is not None else [])
        last, losses = len(self.routes) - 1, []
        with evaluating():
            for micro_batch in range(self.micro_batches):
                held: tuple[torch.Tensor, ...] = ()
                for chunk, route in enumerate(self.routes):
                    if chunk not in chunks:
                        continue
                    if chunk == 0:
                        args = [split[index][micro_batch] for _, index in route.sources]
                    elif self.ranks_of[chunk - 1] == self.rank:
                        args = [held[k] for _, k in route.sources]
                    else:
                        args = []
                        for _, k in route.sources:
                            shape, dtype = self.routes[chunk - 1].outputs[k]
                            buffer = torch.empty(shape, dtype=dtype, device=self._placeholder.device)
                            dist.recv(buffer, group=self.group, group_src=self.ranks_of[chunk - 1], tag=_EVAL_TAG)
                            args.append(buffer)
                    out = chunks[chunk](*args)
                    held = tuple(out) if isinstance(out, (tuple, list)) else (out,)
                    if chunk == last:
                        losses.append(held[0])
                    elif self.ranks_of[chunk + 1] != self.rank:
                        for _, k in self.routes[chunk + 1].sources:
                            dist.send(held[k].contiguous(), group=self.group, group_dst=self.ranks_of[chunk + 1],
                                      tag=_EVAL_TAG)
        return losses

    def sync_tied_gradients(self) -> None:
        """Give every copy of a tied weight the gradient of the one weight it stands for."""
        self.tied_weights.sync(self.micro_batches, self.schedule.scale_grads, list(self.recomputation.replayed))


def splits_backward(schedule: str, ranks: int, virtual: int, micro_batches: int) -> bool:
    """The schedule runs a backward as an input-gradient part and a weight-gradient part (zero bubble)."""
    return any(a.kind == "I" for order in orders(schedule, ranks, virtual, micro_batches) for a in order)


def model_loss(output: torch.Tensor, placeholder: torch.Tensor) -> torch.Tensor:
    """The schedule's ``loss_fn``: the last stage's output already is the model's loss."""
    if output.dim() != 0:
        raise UserError(f"the last stage returns a {list(output.shape)} tensor, not a loss: pipelined training "
                        f"needs a class that computes its loss, given its labels as inputs")
    return output
