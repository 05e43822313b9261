"""What a model can take, as data: ``[model.limits]`` of a family's recipe, checked once before a model is built.

A position table ends (BERT's 512 positions, GPT-2's ``n_positions``), and
RoBERTa's positions start after its padding index; attention splits the width
into heads.  Past such a limit the generated model fails deep inside a trace,
or worse, a plan is made for inputs the model cannot take.  The recipe states
each limit with the config attributes it comes from; :func:`check` evaluates
them on the config the user gave and names the limit in one line::

    [model.limits]
    lengths = { sequence = ["max_position_embeddings - pad_token_id - 1"] }  # each bound applies
    multiples = [["hidden_size", "num_attention_heads"]]                     # hidden_size % heads == 0

A bound is config attributes and integers joined by ``+`` and ``-``; one
whose attribute the config of a release lacks does not apply there.  Stdlib
only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from common.errors import UserError
from common.schema import Check

_TERM = r"(?:[A-Za-z_][A-Za-z0-9_]*|[0-9]+)"
_BOUND = re.compile(rf"{_TERM}(?:\s*[-+]\s*{_TERM})*")
Bound = Annotated[str, Check("config attributes and integers joined by + and -, such as 'n_positions' or "
                             "'max_position_embeddings - pad_token_id - 1'", lambda text: _BOUND.fullmatch(text))]
# Global configuration keys of transformers' configs that the generated models refuse (the recipes' facts).
UNSUPPORTED = {"gradient_checkpointing": False}


@dataclass(frozen=True)
class LimitsSection:
    """``[model.limits]``: bounds of the sequence lengths, and widths that must be multiples of a count."""

    lengths: dict[str, tuple[Bound, ...]] = field(default_factory=dict)
    multiples: tuple[tuple[Bound, Bound], ...] = ()  # (width, count): width % count == 0


def value(bound: str, config: Any) -> tuple[int, str] | None:
    """The bound's value on ``config`` and how it came about (``514 - 1 - 1``); None: an attribute is missing."""
    total, sign, shown = 0, 1, []
    for token in re.findall(rf"{_TERM}|[-+]", bound):
        if token in "+-":
            sign = 1 if token == "+" else -1
            shown.append(token)
            continue
        number = int(token) if token.isdigit() else getattr(config, token, None)
        if isinstance(number, bool) or not isinstance(number, int):
            return None
        total += sign * number
        shown.append(str(number))
    return total, " ".join(shown)


def check(limits: LimitsSection, config: Any, lengths: Mapping[str, int], where: str) -> None:
    """Every limit holds for ``config`` and the sequence ``lengths``; else one :class:`UserError` naming it."""
    for key, allowed in UNSUPPORTED.items():
        if getattr(config, key, allowed) != allowed:
            raise UserError(f"{where} sets {key} = {getattr(config, key)!r}: the generated models support only "
                            f"{allowed!r}", hint="pipelines recompute by themselves: drop the key or set it to "
                                                 f"{str(allowed).lower()}")
    for width, count in limits.multiples:
        found, divisor = value(width, config), value(count, config)
        if found is None or divisor is None:
            continue
        if divisor[0] < 1 or found[0] % divisor[0]:
            raise UserError(f"{where}: {width} ({found[0]}) must be a multiple of {count} ({divisor[0]}), each head "
                            f"takes an equal part")
    for name, bounds in limits.lengths.items():
        length = lengths.get(name)
        for bound in bounds:
            limit = value(bound, config)
            if length is None or limit is None or length <= limit[0]:
                continue
            how = "" if limit[1] == str(limit[0]) else f" = {limit[1]}"
            raise UserError(f"a {name} length of {length} is more than the model takes: at most {bound}{how} = "
                            f"{limit[0]} positions ({where})", hint=f"--seq-len {name}={limit[0]} or less")
