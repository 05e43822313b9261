"""A plan as ``{module_fqn: device}`` for single-process placement over several devices.

The form is the ``module_to_device`` argument of level-order (BFS) placement
tools: the root ``""`` names the default device, a deeper name overrides its
parents.  Stage ``i`` goes to ``f"{prefix}:{rank}"``, the rank the plan places it on (``Plan.ranks``:
stage ``i`` on rank ``i``, or where a schedule running several chunks per rank puts chunk ``i``).
"""

from __future__ import annotations

import torch

from partitioning.plan import Plan


def module_to_device(plan: Plan, prefix: str = "cuda", model: torch.nn.Module | None = None) -> dict[str, str]:
    """Every module a block runs, on its stage's device; the root on the first stage's.

    A module run by two blocks (T5's stack dropout) stays where it first runs.
    With ``model``, every name of a mapped module (T5's ``shared`` is also
    ``encoder.embed_tokens`` and ``decoder.embed_tokens``) gets the device of
    its first use, because a placement tool may visit it under any name.
    """
    names_of: dict[str, list[str]] = {}  # a module name -> every name of that module
    if model is not None:
        by_object: dict[int, list[str]] = {}
        for name, module in model.named_modules(remove_duplicate=False):
            by_object.setdefault(id(module), []).append(name)
        names_of = {name: names for names in by_object.values() for name in names}
    plan.validate()
    placement = {"": f"{prefix}:0"}
    by_name = {block.name: block for block in plan.blocks}
    ranks = plan.ranks
    for stage in plan.stages:
        for block_name in stage.blocks:
            for module in by_name[block_name].modules:
                # One module object lives on one device: the first stage that runs it wins for all its names.
                for name in names_of.get(module, [module]):
                    placement.setdefault(name, f"{prefix}:{ranks[stage.index]}")
    return placement
