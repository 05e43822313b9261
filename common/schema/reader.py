"""Reading a mapping into a dataclass whose annotations are the schema, key by key.

Types: ``str``, ``int``, ``float`` (finite: NaN and infinity are refused),
``bool``, ``Literal[...]`` (one of the given values), ``tuple[X, ...]`` (a
list; ``tuple[X, Y]``: a list of an X and a Y; ``list[X]`` where the record keeps a list), ``dict[K, X]`` (a table; ``K`` may carry a check on the keys), another
dataclass (a nested table), ``X | Y`` (the alternative whose kind the value
has), ``X | None`` (an optional value), ``Any``, and ``Annotated[X, Check(...)]``
(a further test, and the words for a value that fails it).  A key the
dataclass does not declare is an error, never a silent default.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from common.schema.errors import OptionError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

_SCALARS: dict[type, str] = {str: "a string", bool: "true or false", int: "an integer", float: "a finite number"}


@dataclass(frozen=True)
class Check:
    """``Annotated[X, Check(what, test)]``: a value of type X for which ``test`` holds.

    ``what`` names such a value ("a positive integer"); a value that is not even an X is
    reported with it too, and so is any part of it that fails a bare type (an item of a
    list), so a list reads as one thing.  ``must`` words the fault where "must be {what}"
    does not fit; ``hint`` may add a word about the value at fault.
    """

    what: str
    test: Callable[[Any], bool] = lambda value: True
    must: str = ""
    hint: Callable[[Any], str] = lambda value: ""


def pattern(regex: typing.Pattern[str], what: str) -> Check:
    """A string matching all of ``regex``."""
    return Check(what, lambda value: regex.fullmatch(value) is not None)


def at_least(low: int | float, what: str) -> Check:
    return Check(what, lambda value: value >= low)


NON_EMPTY = Check("a non-empty list", lambda value: len(value) > 0)
PositiveInt = Annotated[int, at_least(1, "a positive integer")]
Count = Annotated[int, at_least(0, "an integer >= 0")]
NonNegative = Annotated[float, at_least(0, "a finite number >= 0")]
Proportion = Annotated[float, Check("a number in (0, 1]", lambda value: 0 < value <= 1)]
Text = Annotated[str, Check("a non-empty string", lambda value: value != "")]


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The schema of a transform that takes no options."""


def parse_options(schema: type[T], values: object) -> T:
    """``values`` (a mapping) as an instance of the dataclass ``schema``, checked key by key."""
    if not isinstance(values, Mapping):
        raise OptionError.mismatch("", values, "a table", described=False)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            raise OptionError.unknown(str(key), tuple(fields), f" (did you mean {close[0]}?)" if close else "")
    hints = typing.get_type_hints(schema, include_extras=True)
    converted: dict[str, Any] = {}
    for name, field in fields.items():
        if name in values:
            try:
                converted[name] = convert(hints[name], values[name])
            except OptionError as error:
                raise error.under(name) from None
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise OptionError.missing(name)
    return schema(**converted)


def convert(kind: Any, value: object) -> Any:
    """``value`` checked against the type ``kind`` (and made immutable where it is a sequence)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin is Annotated:
        return _checked(args[0], [arg for arg in kind.__metadata__ if isinstance(arg, Check)], value)
    if origin is Literal:
        if value not in args or type(value) is bool:
            raise OptionError.mismatch("", value, f"one of {', '.join(map(str, args))}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [arg for arg in args if arg is not type(None)]
        fitting = [arg for arg in inner if _has_kind(arg, value)]
        if len(inner) == 1 or len(fitting) == 1:
            return convert(fitting[0] if fitting else inner[0], value)
        whats = [_what(arg) for arg in inner]  # no alternative fits, or (a schema's fault) several could
        raise OptionError.mismatch("", value, " or ".join(w for w, _ in whats), described=all(d for _, d in whats))
    if dataclasses.is_dataclass(kind):
        return parse_options(typing.cast(type, kind), value)
    if origin is list:  # a list that stays one (a mutable record's)
        return list(convert(tuple[args[0], ...], value))  # type: ignore[valid-type]
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise OptionError.mismatch("", value, "a list", described=False)
        fixed = not (len(args) == 2 and args[1] is Ellipsis)  # tuple[X, Y]: a list of exactly an X and a Y
        if fixed and len(value) != len(args):
            raise OptionError.mismatch("", value, f"a list of {len(args)} items", described=False)
        items = []
        for index, item in enumerate(value):
            try:
                items.append(convert(args[index] if fixed else args[0], item))
            except OptionError as error:
                raise error.under(f"[{index}]") from None
        return tuple(items)
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise OptionError.mismatch("", value, "a table", described=False)
        table = {}
        for key, item in value.items():
            try:
                checked = convert(args[0], key)
            except OptionError as error:
                raise OptionError.mismatch("", key, error.what, error.must) from None
            try:
                table[checked] = convert(args[1], item)
            except OptionError as error:
                raise error.under(str(key)) from None
        return table
    if kind in _SCALARS:
        # A bool is an int to Python, not to a file; an integer is a fine float; NaN and infinity are no number.
        fits = type(value) is kind or (kind is float and type(value) is int)
        if not fits or (kind is float and not math.isfinite(typing.cast(float, value))):
            raise OptionError.mismatch("", value, _SCALARS[kind], described=False)
        return value
    raise TypeError(f"unsupported option type {kind!r}")  # a schema bug, not a file's


def _checked(kind: Any, checks: list[Check], value: object) -> Any:
    """``value`` as ``kind``, then through ``checks``; a bare type's fault inside is reported as the check's."""
    words = checks[-1] if checks else None
    try:
        converted = convert(kind, value)
    except OptionError as error:
        # Only a bare type's fault in the value itself or an item of it: a key of a table inside speaks for itself.
        if words is None or error.kind != "mismatch" or error.described or error.key.strip("[]0123456789"):
            raise
        converted = _FAILED
    for check in checks:
        if converted is _FAILED or not check.test(converted):
            fault = OptionError.mismatch("", value, check.what, check.must)
            fault.note = check.hint(value)
            raise fault
    return converted


_FAILED = object()


def _has_kind(kind: Any, value: object) -> bool:
    """Whether ``value`` is the kind of thing ``kind`` reads (a list, a table, a string...), right or not."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Annotated:
        return _has_kind(args[0], value)
    if origin is Literal:
        return any(type(value) is type(arg) for arg in args)
    if origin in (tuple, list):
        return isinstance(value, (list, tuple))
    if origin in (dict, Mapping) or dataclasses.is_dataclass(kind):
        return isinstance(value, Mapping)
    if kind is float:
        return type(value) in (int, float)
    return kind is Any or type(value) is kind


def _what(kind: Any) -> tuple[str, bool]:
    """How a value of ``kind`` is named, and whether by a check."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is Annotated:
        checks = [arg for arg in kind.__metadata__ if isinstance(arg, Check)]
        return (checks[-1].what, True) if checks else _what(args[0])
    if origin is Literal:
        return f"one of {', '.join(map(str, args))}", True
    if origin in (tuple, list):
        return "a list", False
    if origin in (dict, Mapping) or dataclasses.is_dataclass(kind):
        return "a table", False
    return _SCALARS.get(kind, str(kind)), False
