"""Typed options: a dataclass per transform, checked against the values a recipe gives.

A transform declares ``Options``, a frozen dataclass whose annotations are the
schema: ``str``, ``int``, ``float``, ``bool``, ``tuple[X, ...]`` (a TOML array),
``dict[str, X]`` (a TOML table), another dataclass (a nested table),
``X | None`` and ``Any``.  :func:`parse_options` turns a mapping into that
dataclass or raises :class:`OptionError` naming the dotted key at fault, so a
misspelled or mistyped key, at any depth, is an error and never a silent
default.  Checks beyond types go in the dataclass's ``__post_init__`` and raise
:class:`OptionError` too.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

_SCALARS: dict[type, str] = {str: "a string", bool: "true or false", int: "an integer", float: "a number"}


class OptionError(ValueError):
    """An option that does not fit its schema; ``key`` is its dotted path ("" for the whole table)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem

    def under(self, prefix: str) -> OptionError:
        """The same error for the table found at ``prefix``."""
        if not self.key:
            return OptionError(prefix, self.problem)
        return OptionError(prefix + self.key if self.key.startswith("[") else f"{prefix}.{self.key}", self.problem)


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The schema of a transform that takes no options."""


def parse_options(schema: type[T], values: object) -> T:
    """``values`` (a mapping) as an instance of the dataclass ``schema``, checked key by key."""
    if not isinstance(values, Mapping):
        raise OptionError("", f"expected a table, not {_describe(values)}")
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise OptionError(str(key), f"unknown key{hint}; known: {', '.join(fields) or 'none'}")
    hints = typing.get_type_hints(schema)
    converted: dict[str, Any] = {}
    for name, field in fields.items():
        if name in values:
            try:
                converted[name] = _convert(hints[name], values[name])
            except OptionError as error:
                raise error.under(name) from None
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise OptionError(name, "missing (required)")
    return schema(**converted)


def _convert(kind: Any, value: object) -> Any:
    """``value`` checked against the type ``kind`` (and made immutable where it is a sequence)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [arg for arg in args if arg is not type(None)]
        return _convert(inner[0] if len(inner) == 1 else Any, value)
    if dataclasses.is_dataclass(kind):
        return parse_options(typing.cast(type, kind), value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise OptionError("", f"expected a list, not {_describe(value)}")
        items = []
        for index, item in enumerate(value):
            try:
                items.append(_convert(args[0], item))
            except OptionError as error:
                raise error.under(f"[{index}]") from None
        return tuple(items)
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise OptionError("", f"expected a table, not {_describe(value)}")
        table = {}
        for key, item in value.items():
            try:
                table[key] = _convert(args[1], item)
            except OptionError as error:
                raise error.under(str(key)) from None
        return table
    if kind in _SCALARS:
        # A bool is an int to Python, not to a recipe; an integer is a fine float.
        fits = type(value) is kind or (kind is float and type(value) is int)
        if not fits:
            raise OptionError("", f"expected {_SCALARS[kind]}, not {_describe(value)}")
        return value
    raise TypeError(f"unsupported option type {kind!r}")  # a schema bug, not a recipe error


def _describe(value: object) -> str:
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"{type(value).__name__} {value!r}"
