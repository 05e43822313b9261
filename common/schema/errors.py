"""What a value that does not fit its schema is, and how each kind of file says so.

An :class:`OptionError` is structured (the dotted key, the kind of fault, the
value and what was expected), so one reader serves files whose users were
promised different wordings: a recipe's transform options say
``key: expected a string, not int 3``, the family definition and the JSON
files say ``key must be a positive integer, got 0``.  A :class:`Wording`
renders the fault; ``str()`` of an error is the transform options' wording.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass


class OptionError(ValueError):
    """A value that does not fit its schema; ``key`` is its dotted path ("" for the whole table).

    ``OptionError(key, problem)`` is a fault a check describes itself (shown as ``key: problem``, or
    ``key problem`` with ``sep=" "``); :meth:`unknown`, :meth:`missing` and :meth:`mismatch` make the
    faults every schema finds, which each :class:`Wording` words its own way.
    """

    def __init__(self, key: str, problem: str, sep: str = ": ") -> None:
        super().__init__(f"{key}{sep}{problem}" if key else problem)
        self.key, self.problem, self.sep = key, problem, sep
        self.kind = "custom"
        self.value: object = None
        self.what = ""  # a mismatch: the value expected, as a noun ("a positive integer")
        self.must = ""  # ... and as what the key "must" do ("be a positive integer", "list layer counts")
        self.described = False  # a mismatch: ``what`` comes from a check, not from a bare type
        self.known: tuple[str, ...] = ()  # an unknown key: the keys its table knows, in declared order
        self.note = ""  # a word after the value shown, from the check that refused it

    @classmethod
    def unknown(cls, key: str, known: tuple[str, ...], hint: str = "") -> OptionError:
        error = cls(key, f"unknown key{hint}; known: {', '.join(known) or 'none'}")
        error.kind, error.known = "unknown", known
        return error

    @classmethod
    def missing(cls, key: str) -> OptionError:
        error = cls(key, "missing (required)")
        error.kind = "missing"
        return error

    @classmethod
    def mismatch(cls, key: str, value: object, what: str, must: str = "", described: bool = True) -> OptionError:
        error = cls(key, f"expected {what}, not {describe(value)}")
        error.kind, error.value, error.what, error.must, error.described = "mismatch", value, what, must, described
        return error

    def under(self, prefix: str) -> OptionError:
        """The same error for the table found at ``prefix``."""
        key = prefix if not self.key else prefix + self.key if self.key.startswith("[") else f"{prefix}.{self.key}"
        error = OptionError(key, self.problem, self.sep)
        error.kind, error.value, error.what, error.must = self.kind, self.value, self.what, self.must
        error.described, error.known, error.note = self.described, self.known, self.note
        return error

    def render(self, wording: Wording) -> str:
        return wording.render(self)


def describe(value: object) -> str:
    """A value for the transform options' wording: its type and repr."""
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def show_repr(value: object, limit: int = 60) -> str:
    """A value as Python spells it, cut short."""
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def show_json(value: object) -> str:
    """A value as JSON spells it (what the user wrote in a JSON file), cut short."""
    try:
        text = json.dumps(list(value) if isinstance(value, tuple) else value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Wording:
    """How a file's errors read.  Templates see ``path``, ``table`` and ``name`` (the key's table and its own
    name), ``known`` (sorted), ``there`` (" there" inside a table), ``must`` and ``shown``."""

    unknown: str = "unknown key {path!r} (known{there}: {known})"
    missing: str = "{path} is missing"
    mismatch: str = "{path} must {must}, got {shown}"
    show: Callable[[object], str] = show_repr
    top: str = "the top level"  # the path of the whole document
    table: str = "a table"  # what the file format calls a table


    def render(self, error: OptionError) -> str:
        if error.kind == "custom":
            return str(error)
        table, name = _split(error.key)
        fields = {"path": error.key or self.top, "table": table or self.top, "name": name,
                  "known": ", ".join(sorted(error.known)) or "none", "there": " there" if table else "",
                  "must": error.must or f"be {self.table if error.what == 'a table' else error.what}",
                  "shown": self.show(error.value)}
        template = {"unknown": self.unknown, "missing": self.missing, "mismatch": self.mismatch}[error.kind]
        return template.format(**fields) + (error.note if error.kind == "mismatch" else "")


def _split(path: str) -> tuple[str, str]:
    """``a.b[2].c`` -> (``a.b[2]``, ``c``); ``a[2]`` -> (``a``, ``[2]``)."""
    cut = max(path.rfind("."), path.rfind("["))
    if cut < 0:
        return "", path
    return path[:cut], path[cut + 1:] if path[cut] == "." else path[cut:]


class _OptionsWording(Wording):
    """The transform options' wording: ``str()`` of the error."""

    def render(self, error: OptionError) -> str:
        return str(error)


OPTIONS = _OptionsWording()
FILE = Wording()  # the family definition, plan files
