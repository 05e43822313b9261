"""Place a plan on IPUs: which module starts which PopTorch block on which IPU, checked against PopTorch's rules.

Stage ``i`` of the plan runs on IPU ``i``.  Its first block's first module
gets ``BeginBlock(module, user_id, ipu_id=i)``; everything the forward runs
until the next BeginBlock fires stays in that block, as PopTorch does.

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

from partitioning.ipu.config import IPUConfig
from partitioning.ipu.costs import block_shares, rebalance, restage
from partitioning.ipu.errors import IPUError
from partitioning.ipu.layers import count_layers, expand_layers_per_ipu, manual_stages, recompute_blocks
from partitioning.ipu.memory import (IPU_MEMORY_BYTES, TERM_FIXES, TERM_NAMES, MemoryModel, MemoryTerms, Projection,
                                     StageLoad)
from partitioning.ipu.roles import Roles
from partitioning.plan import WORDING as plan_wording
from partitioning.plan import Block, Plan, Stage
from common.schema import Count, OptionError, convert, fail


@dataclass(frozen=True)
class Unit:
    """A call the forward makes, in execution order, where a BeginBlock can start a block."""

    name: str  # the plan block's name, or the called module's name for a call no block lists
    call: str  # the module name as the plan (or the roles' call site) gives it
    module: str  # the module object that call runs in the model's form: what a BeginBlock wraps
    block: str | None  # None for a call site
    stage: int  # the plan stage (and IPU) it belongs to
    stage_start: bool


@dataclass(frozen=True)
class Annotation:
    """``poptorch.BeginBlock(model.<module>, user_id, ipu_id=ipu)``, declared in list order."""

    position: int  # the unit it starts at
    module: str
    user_id: str
    ipu: int
    why: str


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

    def layers_per_ipu(self) -> list[int]:
        """The placement in optimum-graphcore's ``layers_per_ipu`` form: the layers each IPU runs."""
        counts = [0] * self.ipus
        layer_lists = self.roles.layer_lists if self.roles else ()
        by_name = {block.name: block for block in self.plan.blocks}
        for unit, ipu in zip(self.units, self.unit_ipus()):
            if unit.block is not None:
                counts[ipu] += count_layers([by_name[unit.block]], layer_lists)
        return counts

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
    units = _units(plan, list(stages), roles)
    shared = _shared_units(plan, roles, units)
    annotations = _annotate(units, shared, roles)
    # A block's output is what its last module returns.
    recompute = tuple(dict.fromkeys(_module_of(roles, by_name[name].modules[-1]) for name in checkpoints))
    serialized = None
    if memory.projection is not None and config.embedding_serialization_factor > 1 and roles is not None:
        serialized = _module_of(roles, roles.projection)
    return Placement(plan, config, roles, tuple(stages), tuple(units), tuple(annotations), recompute, shared,
                     count_layers(plan.blocks, roles.layer_lists if roles else ()), memory, serialized)


def _memory_model(plan: Plan, config: IPUConfig, roles: Roles | None, checkpoints: Sequence[str]) -> MemoryModel:
    try:
        states = convert(Count, plan.settings.get("optimizer_states", 2))
    except OptionError as error:
        raise fail(error.under("settings.optimizer_states"), "not a plan file", plan_wording) from None
    projection = None
    if roles is not None and roles.projection is not None:
        block = next((b for b in plan.blocks if roles.projection in (_module_of(roles, m) for m in b.modules)), None)
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


def _module_of(roles: Roles | None, name: str) -> str:
    return roles.module_of(name) if roles else name


def _stages(plan: Plan, config: IPUConfig, roles: Roles | None, memory: MemoryModel) -> list[Stage]:
    if config.layers_per_ipu is not None:
        if roles is None:
            raise IPUError("layers_per_ipu needs the model family's layer lists: give the family")
        return restage(plan, manual_stages(plan.blocks, config.layers_per_ipu, roles.layer_lists))
    users = [group for group in _consumer_blocks(plan, roles).values() if len(group) > 1]
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


def _uses(block: Block, weight: str, roles: Roles | None) -> bool:
    if weight in block.shared:
        return True
    users = roles.shared.get(weight, ()) if roles else ()
    # A user may be the block's module or inside it (BERT's word embeddings inside its embeddings block).
    return any(user == owner or user.startswith(owner + ".")
               for owner in (_module_of(roles, module) for module in block.modules) for user in users)


def _weights(plan: Plan, roles: Roles | None) -> list[str]:
    names = list(roles.shared) if roles else []
    return list(dict.fromkeys(names + [weight for block in plan.blocks for weight in block.shared]))


def _consumer_blocks(plan: Plan, roles: Roles | None) -> dict[str, list[str]]:
    """Shared weight -> the blocks using it, in chain order."""
    return {weight: [b.name for b in plan.blocks if _uses(b, weight, roles)] for weight in _weights(plan, roles)}


def _units(plan: Plan, stages: list[Stage], roles: Roles | None) -> list[Unit]:
    by_name = {block.name: block for block in plan.blocks}
    listed = {module for block in plan.blocks for module in block.modules}
    starts = {block.first_module for block in plan.blocks}
    before: dict[str, list[str]] = {}
    for site, next_module in (roles.call_sites.items() if roles else ()):
        if site in listed or next_module not in listed:
            continue  # the plan lists the call itself, or does not cover that part of the model
        if next_module not in starts:
            raise IPUError(f"{site} runs right before {next_module}, which starts no block of the plan: "
                           f"plan with {next_module} starting a block")
        before.setdefault(next_module, []).append(site)
    units: list[Unit] = []
    for stage in stages:
        for position, name in enumerate(stage.blocks):
            block = by_name[name]
            for site in before.get(block.first_module, ()):
                # It runs before this block's BeginBlock fires: still in the block before it.
                units.append(Unit(site, site, _module_of(roles, site), None, units[-1].stage if units else 0, False))
            units.append(Unit(name, block.first_module, _module_of(roles, block.first_module), name, stage.index,
                              position == 0))
    return units


def _shared_units(plan: Plan, roles: Roles | None, units: list[Unit]) -> dict[str, tuple[int, ...]]:
    by_name = {block.name: block for block in plan.blocks}
    shared = {}
    for weight in _weights(plan, roles):
        users = roles.shared.get(weight, ()) if roles else ()
        found = tuple(i for i, unit in enumerate(units)
                      if (unit.block is not None and _uses(by_name[unit.block], weight, roles))
                      or (unit.block is None and unit.module in users))
        # A weight the plan and the roles name differently (costed stateful, placed stateless) is listed once.
        if len(found) > 1 and found not in shared.values():
            shared[weight] = found
    return shared


def _annotate(units: list[Unit], shared: dict[str, tuple[int, ...]], roles: Roles | None) -> list[Annotation]:
    home: dict[int, tuple[int, str]] = {}  # unit -> (IPU its shared weight lives on, weight)
    for weight, found in shared.items():
        ipu = units[found[0]].stage
        for i in found:
            if i in home and home[i][0] != ipu:
                raise IPUError(f"{units[i].name} uses {home[i][1]} (on IPU {home[i][0]}) and {weight} (on IPU {ipu}): "
                               f"plan their first users on one stage")
            home.setdefault(i, (ipu, weight))  # the roles' name for a weight comes first
    fix = roles.hint if roles else "give each call its own module"
    annotations: list[Annotation] = []
    by_module: dict[str, Annotation] = {}
    first_call: dict[str, int] = {}
    previous: int | None = None
    for i, unit in enumerate(units):
        target = home[i][0] if i in home else unit.stage
        first_call.setdefault(unit.module, i)
        if unit.module in by_module:  # the same module object again: its BeginBlock hook fires again
            earlier = by_module[unit.module]
            if earlier.ipu != target:
                raise IPUError(f"{unit.name} calls {unit.module} again, annotated for IPU {earlier.ipu}, but must run "
                               f"on IPU {target}: one module cannot start blocks on two IPUs; {fix}")
            previous = target
            continue
        if unit.stage_start or target != previous:
            if first_call[unit.module] != i:
                raise IPUError(f"{unit.name} needs a BeginBlock on {unit.module}, which already ran unannotated at "
                               f"{units[first_call[unit.module]].name}: {fix}")
            if i in home and target != unit.stage:
                why = f"uses {home[i][1]}: on IPU {target} with its other users"
            elif unit.stage_start:
                why = f"plan stage {unit.stage}"
            else:
                why = f"back to plan stage {unit.stage} after {units[i - 1].name}"
            annotation = Annotation(i, unit.module, unit.name, target, why)
            annotations.append(annotation)
            by_module[unit.module] = annotation
        previous = target
    return annotations


def validate(placement: Placement) -> None:
    """Check, before anything is compiled, every PopTorch rule a placement can break (one-line errors)."""
    for check in (_check_order, _check_ipu_count, _check_lists, _check_batching, _check_shared, _check_used,
                  _check_memory):
        check(placement)


def _check_order(placement: Placement) -> None:
    units = placement.units
    previous: Annotation | None = None
    modules: set[str] = set()
    for annotation in placement.annotations:
        if not 0 <= annotation.position < len(units) or units[annotation.position].module != annotation.module:
            raise IPUError(f"BeginBlock {annotation.user_id!r} names {annotation.module}, which does not run where "
                           f"the placement says: re-place the plan")
        if annotation.module in modules:
            raise IPUError(f"BeginBlock {annotation.user_id!r}: {annotation.module} already starts a block "
                           f"(PopTorch: module has already been assigned to a block): annotate it once")
        if previous is not None and annotation.position <= previous.position:
            raise IPUError(f"BeginBlock {annotation.user_id!r} ({annotation.module}) is declared after "
                           f"{previous.user_id!r} ({previous.module}) but runs before it: declare BeginBlocks "
                           f"in execution order")
        modules.add(annotation.module)
        previous = annotation


def _check_ipu_count(placement: Placement) -> None:
    config = placement.config
    if config.ipus_per_replica != placement.ipus:
        raise IPUError(f"ipus_per_replica is {config.ipus_per_replica} but the placement uses {placement.ipus} IPUs: "
                       f"set it to {placement.ipus} or plan for {config.ipus_per_replica} stages")
    total = placement.ipus * config.replication_factor
    if total & (total - 1) and not config.auto_round_num_ipus:
        raise IPUError(f"{placement.ipus} IPUs x {config.replication_factor} replicas = {total} IPUs, not a power "
                       f"of two as PopTorch requires: plan for a power of two or set auto_round_num_ipus")


def _check_lists(placement: Placement) -> None:
    config = placement.config
    proportions = config.available_memory_proportion
    if isinstance(proportions, tuple) and len(proportions) != placement.ipus:
        raise IPUError(f"available_memory_proportion lists {len(proportions)} values for {placement.ipus} IPUs: "
                       f"give one per IPU or a single number")
    if config.layers_per_ipu is not None:
        if len(config.layers_per_ipu) != placement.ipus:
            raise IPUError(f"layers_per_ipu lists {len(config.layers_per_ipu)} IPUs but the placement uses "
                           f"{placement.ipus}: give one count per IPU")
        expand_layers_per_ipu(config.layers_per_ipu, placement.num_layers)


def _check_batching(placement: Placement) -> None:
    config, stages = placement.config, placement.pipeline_stages
    if config.training and (config.gradient_accumulation or 1) < 2 * stages - 1:
        raise IPUError(f"gradient_accumulation {config.gradient_accumulation} is below {2 * stages - 1}, the "
                       f"pipeline's stages including backward (2x{stages}-1): set gradient_accumulation >= "
                       f"{2 * stages - 1}")
    if not config.training and config.pipelined and (config.device_iterations or 1) < stages:
        raise IPUError(f"device_iterations {config.device_iterations} is below the {stages} pipeline stages that "
                       f"pipelined inference needs: set device_iterations >= {stages}")


def _check_shared(placement: Placement) -> None:
    ipus = placement.unit_ipus()
    for weight, found in placement.shared.items():
        where = {placement.units[i].name: ipus[i] for i in found}
        if len(set(where.values())) > 1:
            spread = ", ".join(f"{name} on IPU {ipu}" for name, ipu in where.items())
            raise IPUError(f"{weight} is used on several IPUs ({spread}); PopTorch needs every user of a weight "
                           f"on one IPU: annotate them all for IPU {ipus[found[0]]}")


def _check_used(placement: Placement) -> None:
    idle = sorted(set(range(placement.ipus)) - set(placement.unit_ipus()))
    if idle:
        raise IPUError(f"IPU {idle[0]} runs nothing once the shared weight's users are moved to their IPU: "
                       f"plan for fewer IPUs or set rebalance_shared")


def _check_memory(placement: Placement) -> None:
    over = [cost for cost in placement.ipu_costs() if cost.memory_bytes > cost.budget_bytes]
    if not over:
        return
    cost = max(over, key=lambda c: c.memory_bytes - c.budget_bytes)  # name the worst of them
    term, size = cost.memory.largest()
    terms = ", ".join(f"{TERM_NAMES[name]} {getattr(cost.memory, name) / 1e6:.1f}"
                      for name in TERM_NAMES if getattr(cost.memory, name) >= 0.05e6)
    raise IPUError(f"IPU {cost.ipu} needs {cost.memory_bytes / 1e6:.1f} MB but a Mk2 IPU has "
                   f"{cost.budget_bytes / 1e6:.1f} MB; the largest term is {TERM_NAMES[term]} ({size / 1e6:.1f} MB; "
                   f"all in MB: {terms}); {len(over)} of {placement.ipus} IPUs are over: {TERM_FIXES[term]}, "
                   f"or use more IPUs")
