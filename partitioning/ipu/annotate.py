"""Where PopTorch blocks start: the calls of a plan's stages in execution order, and their BeginBlocks.

Stage ``i`` of the plan runs on IPU ``i``.  Its first block's first module
gets ``BeginBlock(module, user_id, ipu_id=i)``; everything the forward runs
until the next BeginBlock fires stays in that block, as PopTorch does.  A
shared weight's users are annotated for the IPU of its first user
(:mod:`partitioning.ipu.placement` explains why).
"""

from __future__ import annotations

from dataclasses import dataclass

from partitioning.ipu.errors import IPUError
from partitioning.ipu.roles import Roles
from partitioning.plan import Block, Plan, Stage


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


def module_of(roles: Roles | None, name: str) -> str:
    return roles.module_of(name) if roles else name


def _uses(block: Block, weight: str, roles: Roles | None) -> bool:
    if weight in block.shared:
        return True
    users = roles.shared.get(weight, ()) if roles else ()
    # A user may be the block's module or inside it (BERT's word embeddings inside its embeddings block).
    return any(user == owner or user.startswith(owner + ".")
               for owner in (module_of(roles, module) for module in block.modules) for user in users)


def _weights(plan: Plan, roles: Roles | None) -> list[str]:
    names = list(roles.shared) if roles else []
    return list(dict.fromkeys(names + [weight for block in plan.blocks for weight in block.shared]))


def consumer_blocks(plan: Plan, roles: Roles | None) -> dict[str, list[str]]:
    """Shared weight -> the blocks using it, in chain order."""
    return {weight: [b.name for b in plan.blocks if _uses(b, weight, roles)] for weight in _weights(plan, roles)}


def units_of(plan: Plan, stages: list[Stage], roles: Roles | None) -> list[Unit]:
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
                units.append(Unit(site, site, module_of(roles, site), None, units[-1].stage if units else 0, False))
            units.append(Unit(name, block.first_module, module_of(roles, block.first_module), name, stage.index,
                              position == 0))
    return units


def shared_units(plan: Plan, roles: Roles | None, units: list[Unit]) -> dict[str, tuple[int, ...]]:
    by_name = {block.name: block for block in plan.blocks}
    shared: dict[str, tuple[int, ...]] = {}
    for weight in _weights(plan, roles):
        users = roles.shared.get(weight, ()) if roles else ()
        found = tuple(i for i, unit in enumerate(units)
                      if (unit.block is not None and _uses(by_name[unit.block], weight, roles))
                      or (unit.block is None and unit.module in users))
        # A weight the plan and the roles name differently (costed stateful, placed stateless) is listed once.
        if len(found) > 1 and found not in shared.values():
            shared[weight] = found
    return shared


def annotate(units: list[Unit], shared: dict[str, tuple[int, ...]], roles: Roles | None) -> list[Annotation]:
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
