"""What the IPU target needs beyond the plan, derived from the family's data (never restated per family).

A plan names modules as the costing saw them; a BeginBlock needs the module
*object* in the form the model is run in.  The recipe's ``shared_weight``
step says where the forms differ: stateful, every user of a shared embedding
is the one module holding it (T5's ``encoder.embed_tokens`` and
``decoder.embed_tokens`` are ``shared``), so one hook fires at each call;
stateless (after ``model.make_stateless()``) the users are separate
stateless layers fed one top-level parameter (``shared_embed_weight``).  The
family's block chain gives the layer lists (``layers_per_ipu``) and where a
user that starts a block runs: right before the next block's first module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.errors import UserError
from families.definition import FamilyDefinition
from families.family import definitions
from partitioning.ipu.errors import IPUError

STATELESS_HINT = "call model.make_stateless() first"
STATEFUL_HINT = "call model.make_stateful() first (or plan for the stateless form)"


@dataclass(frozen=True)
class Roles:
    form: str  # which form of the model these roles describe
    marker: str | None  # a parameter name only that form has (None: the family has one form)
    hint: str  # how a user gets that form
    layer_lists: tuple[str, ...]  # module lists whose items count as layers for layers_per_ipu
    shared: dict[str, tuple[str, ...]] = field(default_factory=dict)  # weight -> module objects that use it
    same_module: dict[str, str] = field(default_factory=dict)  # a name the plan may use -> the object in this form
    call_sites: dict[str, str] = field(default_factory=dict)  # a call no block lists -> the module it runs before
    projection: str | None = None  # the vocabulary projection (the shared weight's tied linear, tied or not)

    def module_of(self, name: str) -> str:
        return self.same_module.get(name, name)


def derive_roles(definition: FamilyDefinition, class_name: str, config: Mapping[str, Any], stateless: bool) -> Roles:
    """The roles of ``class_name`` in one form, from its recipe's shared weights and block chain."""
    starts = definition.block_starts(class_name)
    weights = definition.shared[class_name]
    shared: dict[str, tuple[str, ...]] = {}
    same_module: dict[str, str] = {}
    call_sites: dict[str, str] = {}
    for weight in weights:
        flag = weight.tied_config
        if flag is not None and not isinstance(config.get(flag, True), bool):
            raise IPUError(f"the plan's config.{flag} must be true or false, got {config[flag]!r}: re-plan, or fix "
                           f"the plan file")
        head = (weight.tied_linear,) if weight.tied_linear and weight.tied(config) else ()
        if stateless:
            shared[weight.weight] = (*weight.users, *head)
            same_module[weight.module] = weight.users[0]  # a plan costed stateful names the module it was
        else:
            shared[f"{weight.module}.weight"] = (weight.module, *head)
            same_module.update({user: weight.module for user in weight.users if user != weight.module})
        for user in weight.users:
            # A user starting a later block is called right before the block after it (the first block's user
            # is the plan's first block itself).
            index = starts.index(user) if user in starts else -1
            if 0 < index < len(starts) - 1:
                call_sites[user] = starts[index + 1]
    layer_lists = definition.layer_lists(class_name)
    projection = next((weight.tied_linear for weight in weights if weight.tied_linear), None)
    if not weights:
        return Roles("plain", None, "re-plan for this model", layer_lists, call_sites=call_sites)
    if stateless:
        return Roles("stateless", weights[0].weight, STATELESS_HINT, layer_lists, shared, same_module, call_sites,
                     projection)
    # The holder's own weight: the stateless form replaces or removes the holder (nested, as in a base model,
    # or the holder itself a user, as GPT-2's wte is), so only the stateful form has this parameter.
    return Roles("stateful", f"{weights[0].module}.weight", STATEFUL_HINT, layer_lists, shared, same_module,
                 call_sites, projection)


def roles_for(family: str, class_name: str | None, config: Mapping[str, Any], stateless: bool) -> Roles:
    """The roles of a plan's model: its family by name, its class (default: the family's), its config."""
    try:
        known = definitions()
    except UserError as exc:
        raise IPUError(str(exc)) from None
    if not isinstance(config, Mapping):
        raise IPUError(f"the plan's model.config must be a JSON object, got {config!r:.40}")
    if family not in known:
        raise IPUError(f"the IPU target knows no family {family!r} (known: {', '.join(sorted(known))})")
    definition = known[family]
    class_name = class_name or definition.default_class
    if class_name not in definition.classes:
        raise IPUError(f"the {family} family has no class {class_name!r} (known: {', '.join(definition.classes)})")
    return derive_roles(definition, class_name, config, stateless)
