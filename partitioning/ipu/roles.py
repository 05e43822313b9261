"""Per-family knowledge the IPU target needs beyond the plan, kept as data.

A plan names modules as the costing saw them; a BeginBlock needs the module
*object* in the form the model is run in.  T5's two forms differ exactly
there: stateful, ``encoder.embed_tokens`` and ``decoder.embed_tokens`` are
the one module ``shared``, so one hook fires at both calls; stateless (after
``model.make_stateless()``), they are separate stateless layers fed the
top-level ``shared_embed_weight``, and ``shared`` is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from partitioning.ipu.errors import IPUError


@dataclass(frozen=True)
class Roles:
    form: str  # which form of the model these roles describe
    marker: str  # an attribute only that form has
    hint: str  # how a user gets that form
    layer_lists: tuple[str, ...]  # module lists whose items count as layers for layers_per_ipu
    shared: dict[str, tuple[str, ...]] = field(default_factory=dict)  # weight -> module objects that use it
    same_module: dict[str, str] = field(default_factory=dict)  # a name the plan may use -> the object in this form
    call_sites: dict[str, str] = field(default_factory=dict)  # a call no block lists -> the module it runs before

    def module_of(self, name: str) -> str:
        return self.same_module.get(name, name)


def t5_roles(tied: bool, stateless: bool) -> Roles:
    head = ("lm_head",) if tied else ()
    layer_lists = ("encoder.block", "decoder.block")
    # The decoder embeds its ids at the start of its forward, right before its first layer.
    call_sites = {"decoder.embed_tokens": "decoder.block.0"}
    if stateless:
        return Roles("stateless", "shared_embed_weight", "call model.make_stateless() first", layer_lists,
                     {"shared_embed_weight": ("encoder.embed_tokens", "decoder.embed_tokens", *head)},
                     {"shared": "encoder.embed_tokens"}, call_sites)
    return Roles("stateful", "shared", "call model.make_stateful() first (or plan for the stateless form)",
                 layer_lists, {"shared.weight": ("shared", *head)},
                 {"encoder.embed_tokens": "shared", "decoder.embed_tokens": "shared"}, call_sites)


FAMILIES: dict[str, Callable[[bool, bool], Roles]] = {"t5": t5_roles}


def roles_for(family: str, tied: bool, stateless: bool) -> Roles:
    try:
        return FAMILIES[family](tied, stateless)
    except KeyError:
        raise IPUError(f"the IPU target knows no family {family!r} (known: {', '.join(FAMILIES)})") from None
