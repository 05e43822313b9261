"""One typed reader for every structured input: transform options, the family definition, plan, IPU config
and calibration files.

A dataclass is the schema (:mod:`common.schema.reader` lists the types it may use); :func:`parse_options`
reads a mapping into it or raises :class:`OptionError` naming the dotted key at fault, at any depth.  Checks
across keys go in the dataclass's ``__post_init__`` and raise :class:`OptionError` too.  :func:`read` does
the same for a user's file, as one :class:`UserError` line worded as that file's users were promised.
"""

from __future__ import annotations

from typing import TypeVar

from common.errors import UserError
from common.schema.errors import FILE, OPTIONS, OptionError, Wording, show_json, show_repr
from common.schema.reader import (
    NON_EMPTY,
    Check,
    Count,
    NonNegative,
    NoOptions,
    PositiveInt,
    Proportion,
    Text,
    at_least,
    convert,
    parse_options,
    pattern,
)

__all__ = ["FILE", "NON_EMPTY", "OPTIONS", "Check", "Count", "NoOptions", "NonNegative", "OptionError",
           "PositiveInt", "Proportion", "Text", "Wording", "at_least", "convert", "fail", "parse_options",
           "pattern", "read", "show_json", "show_repr"]

T = TypeVar("T")


def read(schema: type[T], values: object, origin: str, wording: Wording = FILE,
         error: type[UserError] = UserError) -> T:
    """``values`` as ``schema`` (a dataclass); a fault is one ``error`` line: ``{origin}: {fault}``."""
    try:
        return parse_options(schema, values)  # type: ignore[type-var]
    except OptionError as fault:
        raise fail(fault, origin, wording, error) from None


def fail(fault: OptionError, origin: str, wording: Wording = FILE, error: type[UserError] = UserError) -> UserError:
    """The one-line error of ``fault`` in the file ``origin``."""
    return error(f"{origin}: {fault.render(wording)}" if origin else fault.render(wording))
