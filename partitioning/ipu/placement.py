"""Place a plan on IPUs: which module starts which PopTorch block on which IPU, checked against PopTorch's rules.

Stage ``i`` of the plan runs on IPU ``i`` (:mod:`partitioning.ipu.annotate`
says where its BeginBlocks go, :mod:`partitioning.ipu.rules` checks them).
Where the plan leaves IPU 0 over its memory once it also runs the shared
weight's users, the plan's blocks are re-split knowing that (:func:`_stages`).

Shared weights: PopTorch needs every user of a weight on one IPU.  Each
shared weight stays on the IPU of its first user (IPU 0 for T5's
embedding); a later user planned elsewhere gets its own BeginBlock on that
IPU, and the module after it one back to its planned IPU.  Under
``AutoStage.AutoIncrement`` each of these is a new pipeline stage, which is
what optimum-graphcore does for T5's LM head; the head's compute and memory
are charged to IPU 0 in :meth:`Placement.ipu_costs`, and the extra stages
raise the gradient accumulation PopTorch requires (2N-1 for N stages).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from common.schema import Count, OptionError, convert, fail
from partitioning.ipu.annotate import Annotation, Unit, annotate, consumer_blocks, module_of, shared_units, units_of
from partitioning.ipu.config import IPUConfig
from partitioning.ipu.costs import block_shares, rebalance, restage
from partitioning.ipu.errors import IPUError
from partitioning.ipu.layers import count_layers, ipu_layer_counts, manual_stages, recompute_blocks
from partitioning.ipu.memory import IPU_MEMORY_BYTES, MemoryModel, MemoryTerms, Projection, StageLoad
from partitioning.ipu.roles import Roles
from partitioning.ipu.rules import validate
from partitioning.plan import WORDING as plan_wording
from partitioning.plan import Block, Plan, Stage

__all__ = ["Annotation", "IPUCost", "PipelineStage", "Placement", "Unit", "Visit", "place", "plan_ipu", "validate"]


@dataclass(frozen=True)
class Visit:
    unit: str
    user_id: str
    ipu: int
    pipeline_stage: int
    again: bool  # an already-started block starts again: its module is called a second time


@dataclass(frozen=True)
class PipelineStage:
    index: int
    ipu: int
    user_ids: tuple[str, ...]


@dataclass(frozen=True)
class IPUCost:
    ipu: int
    compute: float  # seconds per micro-batch, as placed
    stage_compute: float  # the stage placed on this IPU, before the shared-weight rule moves users in or out
    memory: MemoryTerms  # what the IPU holds, by term (partitioning.ipu.memory)
    budget_bytes: float = IPU_MEMORY_BYTES

    @property
    def memory_bytes(self) -> float:
        return self.memory.total


@dataclass(frozen=True)
class Placement:
    plan: Plan
    config: IPUConfig  # with the derived values filled in
    roles: Roles | None
    stages: tuple[Stage, ...]  # stage i runs on IPU i: the plan's, or remade by layers_per_ipu / rebalancing
    units: tuple[Unit, ...]
    annotations: tuple[Annotation, ...]
    recompute: tuple[str, ...]  # modules whose outputs are recomputation checkpoints
    shared: dict[str, tuple[int, ...]]  # shared weight -> the units using it
    num_layers: int
    memory: MemoryModel
    serialized: str | None = None  # the vocabulary projection, run as embedding_serialization_factor matmuls

    @property
    def ipus(self) -> int:
        return len(self.stages)

    @property
    def rebalanced(self) -> bool:
        return [s.blocks for s in self.stages] != [s.blocks for s in self.plan.stages]

    def in_effect(self) -> list[Annotation | None]:
        """The annotation whose block each unit runs in: a BeginBlock hook fires whenever its module runs."""
        by_module = {a.module: a for a in self.annotations}
        current: Annotation | None = None
        found = []
        for unit in self.units:
            current = by_module.get(unit.module, current)
            found.append(current)
        return found

    def unit_ipus(self) -> list[int]:
        # PopTorch puts what runs before the first BeginBlock on IPU 0.
        return [annotation.ipu if annotation else 0 for annotation in self.in_effect()]

    def pipeline(self) -> list[PipelineStage]:
        """PopTorch's pipeline stages: AutoIncrement numbers blocks as they first run; neighbours on one IPU merge."""
        by_module = {a.module: a for a in self.annotations}
        seen: list[Annotation] = []
        for unit in self.units:
            annotation = by_module.get(unit.module)
            if annotation is not None and annotation not in seen:
                seen.append(annotation)
        stages: list[PipelineStage] = []
        for annotation in seen:
            if stages and stages[-1].ipu == annotation.ipu:
                stages[-1] = replace(stages[-1], user_ids=stages[-1].user_ids + (annotation.user_id,))
            else:
                stages.append(PipelineStage(len(stages), annotation.ipu, (annotation.user_id,)))
        return stages

    @property
    def pipeline_stages(self) -> int:
        return len(self.pipeline())

    def visits(self) -> list[Visit]:
        """Each block start the forward makes, in order: what a tracer of BeginBlock hooks records."""
        stage_of = {user_id: stage.index for stage in self.pipeline() for user_id in stage.user_ids}
        by_module = {a.module: a for a in self.annotations}
        visits, started = [], set()
        for unit in self.units:
            annotation = by_module.get(unit.module)
            if annotation is not None:
                visits.append(Visit(unit.name, annotation.user_id, annotation.ipu, stage_of[annotation.user_id],
                                    annotation.user_id in started))
                started.add(annotation.user_id)
        return visits

    def stage_loads(self) -> list[list[StageLoad]]:
        """Per IPU, the pipeline stages it runs: their numbers, blocks and the bytes each receives."""
        stage_of = {user_id: stage.index for stage in self.pipeline() for user_id in stage.user_ids}
        by_name = {block.name: block for block in self.plan.blocks}
        loads: dict[int, tuple[int, list[Block], int]] = {}
        previous: Block | None = None
        for unit, annotation in zip(self.units, self.in_effect()):
            if unit.block is None:
                continue
            block = by_name[unit.block]
            index = stage_of[annotation.user_id] if annotation else 0
            if index not in loads:
                loads[index] = (annotation.ipu if annotation else 0, [], previous.out_bytes if previous else 0)
            loads[index][1].append(block)
            previous = block
        per_ipu: list[list[StageLoad]] = [[] for _ in range(self.ipus)]
        for index, (ipu, blocks, received) in sorted(loads.items()):
            per_ipu[ipu].append(StageLoad(index, tuple(blocks), received))
        return per_ipu

    def ipu_costs(self) -> list[IPUCost]:
        shares = block_shares(self.plan)
        compute = [0.0] * self.ipus
        for unit, ipu in zip(self.units, self.unit_ipus()):
            if unit.block is not None:
                compute[ipu] += shares[unit.block].seconds
        proportions = _proportions(self.config, self.ipus)
        n = self.pipeline_stages
        return [IPUCost(ipu, compute[ipu], stage.compute, self.memory.terms(loads, n, proportions[ipu]))
                for ipu, (stage, loads) in enumerate(zip(self.stages, self.stage_loads()))]

    def layers_per_ipu(self) -> list[int] | str:
        """The placement in optimum-graphcore's ``layers_per_ipu`` form, or why it has none (a layer split)."""
        layer_lists = self.roles.layer_lists if self.roles else ()
        by_name = {block.name: block for block in self.plan.blocks}
        placed = [(by_name[unit.block], ipu) for unit, ipu in zip(self.units, self.unit_ipus()) if unit.block]
        return ipu_layer_counts(placed, layer_lists, self.ipus)

    @property
    def bottleneck(self) -> float:
        """Seconds per micro-batch of the busiest IPU: an IPU runs all its pipeline stages one after another."""
        return max(cost.compute for cost in self.ipu_costs())

    @property
    def step_seconds(self) -> float:
        """Predicted seconds per step: pipelined, m micro-batches take (m + N - 1) busiest-IPU slots."""
        if not self.config.pipelined:
            return (self.config.device_iterations or 1) * sum(cost.compute for cost in self.ipu_costs())
        batches = self.config.gradient_accumulation if self.config.training else self.config.device_iterations
        return ((batches or 1) + self.pipeline_stages - 1) * self.bottleneck


def place(plan: Plan, config: IPUConfig, roles: Roles | None = None) -> Placement:
    """The annotations that run ``plan`` on IPUs under PopTorch (unchecked: see :func:`validate`)."""
    plan.validate()
    layer_lists = roles.layer_lists if roles else ()
    by_name = {block.name: block for block in plan.blocks}
    names = list(config.recompute_checkpoints)
    if config.recompute_every_layer:
        names += recompute_blocks(plan.blocks, layer_lists)
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise IPUError(f"recompute_checkpoints names unknown block {unknown[0]!r} (blocks: "
                       f"{', '.join(by_name)})")
    memory = _memory_model(plan, config, roles, names)
    stages = _stages(plan, config, roles, memory)
    draft = _draft(plan, config, roles, stages, names, memory)
    return replace(draft, config=config.resolved(len(stages), draft.pipeline_stages))


def _draft(plan: Plan, config: IPUConfig, roles: Roles | None, stages: Sequence[Stage], checkpoints: Sequence[str],
           memory: MemoryModel) -> Placement:
    by_name = {block.name: block for block in plan.blocks}
    units = units_of(plan, list(stages), roles)
    shared = shared_units(plan, roles, units)
    annotations = annotate(units, shared, roles)
    # A block's output is what its last module returns.
    recompute = tuple(dict.fromkeys(module_of(roles, by_name[name].modules[-1]) for name in checkpoints))
    serialized = None
    if memory.projection is not None and config.embedding_serialization_factor > 1 and roles is not None \
            and roles.projection is not None:
        serialized = module_of(roles, roles.projection)
    return Placement(plan, config, roles, tuple(stages), tuple(units), tuple(annotations), recompute, shared,
                     count_layers(plan.blocks, roles.layer_lists if roles else ()), memory, serialized)


def _memory_model(plan: Plan, config: IPUConfig, roles: Roles | None, checkpoints: Sequence[str]) -> MemoryModel:
    try:
        states = convert(Count, plan.settings.get("optimizer_states", 2))
    except OptionError as error:
        raise fail(error.under("settings.optimizer_states"), "not a plan file", plan_wording) from None
    projection = None
    if roles is not None and roles.projection is not None:
        block = next((b for b in plan.blocks if roles.projection in (module_of(roles, m) for m in b.modules)), None)
        if block is not None:
            sizes = plan.model.get("shared_bytes")
            sizes = sizes if isinstance(sizes, dict) else {}
            tied = [sizes[name] for name in block.shared if isinstance(sizes.get(name), int)]
            projection = Projection(block.name, sum(tied) if tied else block.param_bytes)
    return MemoryModel(config, states, frozenset(checkpoints), projection)


def _proportions(config: IPUConfig, ipus: int) -> tuple[float, ...]:
    proportions = config.memory_proportions(ipus)
    return proportions if len(proportions) == ipus else (min(proportions),) * ipus  # a wrong count: _check_lists


def plan_ipu(plan: Plan, config: IPUConfig, roles: Roles | None = None) -> Placement:
    """:func:`place`, then :func:`validate`: a placement PopTorch's rules accept."""
    placement = place(plan, config, roles)
    validate(placement)
    return placement


def _stages(plan: Plan, config: IPUConfig, roles: Roles | None, memory: MemoryModel) -> list[Stage]:
    if config.layers_per_ipu is not None:
        if roles is None:
            raise IPUError("layers_per_ipu needs the model family's layer lists: give the family")
        return restage(plan, manual_stages(plan.blocks, config.layers_per_ipu, roles.layer_lists))
    users = [group for group in consumer_blocks(plan, roles).values() if len(group) > 1]
    ipus = len(plan.stages)
    if not (config.rebalance_shared and users):
        return list(plan.stages)
    # Searching splits, a group's pipeline stage is taken as its IPU's number in a pipeline as long as the plan's
    # own placement makes: never fewer micro-batches in flight than the final placement, so a split found here
    # fits; validate() then checks the placement exactly.
    try:
        n = _draft(plan, config, roles, plan.stages, (), memory).pipeline_stages
    except IPUError:
        n = 2 * ipus - 1
    by_name = {block.name: block for block in plan.blocks}
    proportions = _proportions(config, ipus)

    def fits(ipu: int, group: Sequence[str], moved_in: Sequence[str]) -> bool:
        first = plan.blocks.index(by_name[group[0]]) if group else 0
        received = plan.blocks[first - 1].out_bytes if first else 0
        loads = [StageLoad(ipu, tuple(by_name[name] for name in group), received)]
        loads += [StageLoad(ipu, (by_name[name],), plan.blocks[plan.blocks.index(by_name[name]) - 1].out_bytes)
                  for name in moved_in]
        return memory.terms(loads, n, proportions[ipu]).total <= IPU_MEMORY_BYTES

    return restage(plan, rebalance(plan, ipus, users, fits))
