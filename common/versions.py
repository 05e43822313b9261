"""Release numbers and ranges of them (the PEP 440 subset package releases use): the one parser.

Every release number the project reads goes through :meth:`Release.parse`: a
``--version``, a recipe's verified releases and ranges, the install script's
dependency eras.  A *release* is ``N(.N){0,3}`` with an optional pre-release
(``a``/``b``/``rc`` N), post-release (``.postN``) or dev-release (``.devN``)
suffix, spelled as the registry spells it (no leading zeros, no blanks, at most
64 characters: pip would fetch 4.5.1 for 04.5.1): ``4.5.1``, ``5.0.0rc1``.
A *range* is comma-separated clauses that must all hold, each an operator
(``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``) and a release, where ``==``/``!=``
may end in ``.*`` (a prefix match): ``">=4.20,<4.46"``, ``"==4.5.*"``.  Missing trailing components are zeros (``4.20 == 4.20.0``);
as PEP 440 says, ``<V`` does not admit pre-releases of ``V`` itself.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_NUMBER = r"(?:0|[1-9]\d*)"
_RELEASE = re.compile(rf"({_NUMBER}(?:\.{_NUMBER}){{0,3}})(?:(a|b|rc)({_NUMBER}))?(?:\.post({_NUMBER}))?"
                      rf"(?:\.dev({_NUMBER}))?")
_MAX_LENGTH = 64
_CLAUSE = re.compile(r"\s*(==|!=|<=|>=|<|>)\s*([0-9][0-9a-z.]*?)(\.\*)?\s*")
_PHASES = {"a": 0, "b": 1, "rc": 2}
_FINAL = 3
_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


class VersionError(ValueError):
    """A release number or range that does not parse."""


@dataclass(frozen=True, order=True)
class Release:
    numbers: tuple[int, ...]  # without trailing zeros, so that 4.20 == 4.20.0
    phase: tuple[int, int]  # (a=0 / b=1 / rc=2 / final=3, number); a dev release of a final sorts first
    post: int
    dev: float  # inf when not a dev release: a dev release sorts before its base

    @classmethod
    def parse(cls, text: str) -> Release:
        found = _RELEASE.fullmatch(text) if len(text) <= _MAX_LENGTH else None
        if found is None:
            raise VersionError(f"{text!r} is not a release number")
        numbers, phase, phase_number, post, dev = found.groups()
        parts = tuple(int(part) for part in numbers.split("."))
        while len(parts) > 1 and parts[-1] == 0:
            parts = parts[:-1]
        pre = (_PHASES[phase], int(phase_number)) if phase else (_FINAL, 0)
        if dev is not None and phase is None and post is None:
            pre = (-1, 0)  # 1.0.dev1 comes before 1.0a1
        return cls(parts, pre, int(post) if post is not None else -1,
                   int(dev) if dev is not None else float("inf"))

    @property
    def is_prerelease(self) -> bool:
        return self.phase[0] != _FINAL or self.dev != float("inf")


@dataclass(frozen=True)
class _Clause:
    op: str
    release: Release
    prefix: tuple[int, ...] | None  # set for ``==X.*`` / ``!=X.*``

    def admits(self, release: Release) -> bool:
        if self.prefix is not None:
            numbers = release.numbers + (0,) * max(0, len(self.prefix) - len(release.numbers))
            inside = numbers[:len(self.prefix)] == self.prefix
            return inside if self.op == "==" else not inside
        if self.op == "<" and not self.release.is_prerelease and release.is_prerelease \
                and release.numbers == self.release.numbers:
            return False
        return _OPERATORS[self.op](release, self.release)


@dataclass(frozen=True)
class VersionRange:
    text: str
    clauses: tuple[_Clause, ...]

    @classmethod
    def parse(cls, text: str) -> VersionRange:
        clauses = []
        for part in text.split(","):
            found = _CLAUSE.fullmatch(part)
            if found is None:
                raise VersionError(f"{text!r} is not a release range (e.g. \">=4.20,<4.46\")")
            op, number, wildcard = found.groups()
            if wildcard and op not in ("==", "!="):
                raise VersionError(f"{text!r}: only == and != take a .* suffix")
            release = Release.parse(number)
            prefix = tuple(int(n) for n in number.split(".")) if wildcard else None
            clauses.append(_Clause(op, release, prefix))
        return cls(text, tuple(clauses))

    def __contains__(self, version: str | Release) -> bool:
        release = version if isinstance(version, Release) else Release.parse(version)
        return all(clause.admits(release) for clause in self.clauses)

    def __str__(self) -> str:
        return self.text
