"""A family's ``[ipu]`` section: how optimum-graphcore trains it on IPUs, and the layouts it published.

The recipe's ``[ipu]`` table (kept as written in :attr:`FamilyDefinition.sections`) sets
defaults for the IPU config fields below, as optimum-graphcore's published IPU configuration
for the family sets up training (IPU count, micro-batch, precision, recomputation,
optimizer-state location, embedding serialization, matmul memory proportion): the starting
point of ``partition-model --target ipu``, under ``--ipu-config``.  ``[ipu.published.<shape>]``
are the published ``layers_per_ipu`` layouts partition-model prints beside its own.  A key
that is misspelled or mistyped is one line naming the recipe and the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any

from common.schema import Check, OptionError, PositiveInt, Proportion, fail, parse_options
from families.definition import FamilyDefinition


@dataclass(frozen=True)
class PublishedLayout:
    """A ``layers_per_ipu`` layout someone published for one shape (optimum-graphcore's hub configs)."""

    shape: str
    ipus: int
    layers_per_ipu: tuple[int, ...]
    source: str  # where it was published


@dataclass(frozen=True)
class _Layout:
    """``[ipu.published.<shape>]`` as the recipe spells it."""

    ipus: PositiveInt
    layers_per_ipu: Annotated[tuple[int, ...], Check("layer counts (>= 0, or -1)",
                                                     lambda counts: all(n >= -1 for n in counts))]
    source: str

    def __post_init__(self) -> None:
        if len(self.layers_per_ipu) != self.ipus:
            raise OptionError("layers_per_ipu", f"must list {self.ipus} layer counts (>= 0, or -1), got "
                                                f"{list(self.layers_per_ipu)!r}", sep=" ")


@dataclass(frozen=True)
class IPUSection:
    """The ``[ipu]`` table: IPU config defaults (the fields but ``published``) and published layouts by shape."""

    ipus_per_replica: PositiveInt | None = None
    micro_batch_size: PositiveInt | None = None
    available_memory_proportion: Proportion | None = None
    recompute_every_layer: bool | None = None
    embedding_serialization_factor: PositiveInt | None = None
    enable_half_partials: bool | None = None
    enable_half_first_order_momentum: bool | None = None
    half_precision: bool | None = None
    optimizer_state_offchip: bool | None = None
    replicated_tensor_sharding: bool | None = None
    stochastic_rounding: bool | None = None
    unsupported: str | None = None  # why this family is not placed on IPUs at all (partition-model refuses)
    published: dict[str, _Layout] = field(default_factory=dict)

    @property
    def defaults(self) -> dict[str, Any]:
        """The IPU config fields the family sets."""
        return {key: value for key, value in vars(self).items()
                if key not in ("published", "unsupported") and value is not None}

    def layout(self, shape: str) -> PublishedLayout | None:
        """The layout published for ``shape``, if any."""
        found = self.published.get(shape)
        return None if found is None else PublishedLayout(shape, found.ipus, found.layers_per_ipu, found.source)


def ipu_section(definition: FamilyDefinition | None) -> IPUSection:
    """The family's ``[ipu]`` section, checked (an empty one where the family or the section is absent)."""
    if definition is None:
        return IPUSection()
    try:
        section = parse_options(IPUSection, definition.sections.get("ipu", {}))
        for shape in section.published:
            if shape not in definition.shapes:
                raise OptionError.unknown(f"published.{shape}", tuple(definition.shapes))
    except OptionError as error:
        raise fail(error.under("ipu"), f"recipe {definition.origin}") from None
    return section
