"""PopTorch's rules, checked on a placement before anything is compiled: each break is one line naming the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

from partitioning.ipu.errors import IPUError
from partitioning.ipu.layers import expand_layers_per_ipu
from partitioning.ipu.memory import TERM_FIXES, TERM_NAMES

if TYPE_CHECKING:
    from partitioning.ipu.annotate import Annotation
    from partitioning.ipu.placement import Placement


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
