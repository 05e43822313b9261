"""The recipe options of ``specialize_arguments``: constants to fix, facts to assume, and where they apply."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from common.schema import OptionError
from transforms.analysis.facts import Fact
from transforms.analysis.literals import is_constant


def _constant(key: str, text: str) -> cst.BaseExpression:
    try:
        value = cst.parse_expression(text)
    except cst.ParserSyntaxError:
        value = None
    if value is None or not is_constant(value):
        raise OptionError(key, f"{text!r} is not a literal constant")
    return value


def expression_option(key: str, text: str) -> cst.BaseExpression:
    """The expression an option ``key`` holds as text, or an OptionError naming the key."""
    try:
        return cst.parse_expression(text)
    except cst.ParserSyntaxError:
        raise OptionError(key, f"{text!r} is not an expression") from None


@dataclass(frozen=True)
class FactOptions:
    expression: str
    value: str
    reason: str | None = None  # the guard's message; default: "assumed <expression> == <value>"
    guard: bool = True  # false: no runtime check (the reason must then say why the fact holds)
    # The condition the guard asserts, where the default form does not fit every tracer: a plain
    # Python value (module state such as self.model_parallel) is best checked with `not`.
    check: str | None = None
    # The check is a tensor computed from the data (BART's <eos> counts): asserted with torch._assert_async.
    on_device: bool = False

    def __post_init__(self) -> None:
        expression_option("expression", self.expression)
        # A guard compares with the value, so it must be a literal; an unguarded fact may
        # state any expression the recipe vouches for (its reason says why it is equivalent).
        if self.guard:
            _constant("value", self.value)
        else:
            expression_option("value", self.value)
        if self.check is not None:
            expression_option("check", self.check)
        if not self.guard and not self.reason:
            raise OptionError("reason", f"an unguarded fact ({self.expression}) needs the reason it holds")
        if not self.guard and self.check is not None:
            raise OptionError("check", f"an unguarded fact ({self.expression}) has no check")
        if self.on_device and self.check is None:
            raise OptionError("on_device", f"is for a recipe's own tensor check ({self.expression} has none)", sep=" ")

    def fact(self) -> Fact:
        reason = self.reason if self.reason is not None else f"assumed {self.expression} == {self.value}"
        check = cst.parse_expression(self.check) if self.check is not None else None
        return Fact(cst.parse_expression(self.expression), cst.parse_expression(self.value), reason, check,
                    guarded=self.guard, on_device=self.on_device)


@dataclass(frozen=True)
class SpecializeOptions:
    constants: dict[str, str]  # parameter name -> the literal it is fixed to
    pure_methods: tuple[str, ...] = ()  # methods whose unused results may be dropped with their call
    facts: tuple[FactOptions, ...] = ()
    # Only the methods of these top-level classes (default: every function of the module).
    classes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, text in self.constants.items():
            _constant(f"constants.{name}", text)
