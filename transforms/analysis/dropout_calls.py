"""Read a ``torch.nn.functional.dropout`` call: its arguments by name, and whether it follows a training flag.

``dropout_module`` turns the calls these functions accept into submodule calls;
a reason string says why a call must stay functional.
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m

from transforms.analysis.literals import is_bool
from transforms.analysis.syntax import code_of

DROPOUT = "torch.nn.functional.dropout"
# Its signature, in positional order.
PARAMETERS = ("input", "p", "training", "inplace")


def bind(args: Sequence[cst.Arg]) -> dict[str, cst.Arg] | str:
    """The call's arguments by parameter name, or why they cannot be bound."""
    bound: dict[str, cst.Arg] = {}
    for position, arg in enumerate(args):
        if arg.star:
            return "dropout called with * or ** arguments"
        if arg.keyword is None and position >= len(PARAMETERS):
            return "dropout called with too many arguments"
        name = PARAMETERS[position] if arg.keyword is None else arg.keyword.value
        if name not in PARAMETERS or name in bound:
            return f"dropout called with an unexpected argument `{name}`"
        bound[name] = arg
    return bound if "input" in bound else "dropout called without its input"


def method_refusal(bound: dict[str, cst.Arg], receiver: str | None) -> str | None:
    """Why a dropout in a method does not follow ``<receiver>.training``, or None when it does."""
    training = bound.get("training")
    if training is None:
        return "training hard-coded to True (the default)"
    if is_bool(training.value):
        return f"training hard-coded to {code_of(training.value)}"
    if receiver is None or not m.matches(training.value, m.Attribute(value=m.Name(receiver), attr=m.Name("training"))):
        return f"training={code_of(training.value)} is not the instance's training flag"
    return None


def function_refusal(bound: dict[str, cst.Arg], parameters: set[str]) -> str | None:
    """Why a dropout in a module-level function does not follow ``<parameter>.training``, or None."""
    training = bound.get("training")
    if training is None:
        return "training hard-coded to True (the default)"
    if not m.matches(training.value, m.Attribute(value=m.Name(), attr=m.Name("training"))) \
            or training.value.value.value not in parameters:  # type: ignore[attr-defined]  # matched above
        return f"training={code_of(training.value)} is not the training flag of a module the function is given"
    inplace = bound.get("inplace")
    if inplace is not None and not m.matches(inplace.value, m.Name("False")):
        return "in-place dropout"
    return None
