"""What both console scripts share: the runner (signals, one-line errors, exit codes) and the argument parser.

A command is two functions: ``parse(argv)`` turns the command line into a
request (anything with a ``verbose`` flag) and ``execute(request)`` does the
work and returns the exit code.  :func:`run` calls them and turns every way
they can fail into one line on stderr and exit code 2: a :class:`UserError`
(with its hint), an ``OSError`` nothing foresaw, Ctrl-C, SIGTERM or SIGHUP,
and, as a last resort, any other exception (``-v`` prints its traceback).
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, Protocol, TypeVar

from common.errors import Interrupted, UserError, terminate_as_interrupt

FAILED = 2  # the exit code of a user error, an interrupt and an internal error alike


class Verbose(Protocol):
    @property
    def verbose(self) -> bool: ...


R = TypeVar("R", bound=Verbose)


def run(prog: str, parse: Callable[[list[str] | None], R], execute: Callable[[R], int],
        argv: list[str] | None = None) -> int:
    """``execute(parse(argv))``'s exit code, every failure reported as one line ``PROG: error: ...``."""
    with terminate_as_interrupt():
        try:
            return _run(prog, parse, execute, argv)
        except (KeyboardInterrupt, Interrupted):
            return interrupted(prog)


def _run(prog: str, parse: Callable[[list[str] | None], R], execute: Callable[[R], int],
         argv: list[str] | None) -> int:
    request: R | None = None
    try:
        request = parse(argv)
        return execute(request)
    except SystemExit as exc:  # --help and --version print and exit 0
        return 0 if exc.code in (0, None) else FAILED
    except (UserError, OSError) as exc:
        return report(prog, exc)
    except Exception as exc:  # last resort: a bug or an input nobody foresaw still gets one line
        if request is not None and request.verbose:
            traceback.print_exc()
        detail = " ".join(str(exc).split())[:300]
        print(f"{prog}: error: internal error: {type(exc).__name__}: {detail} "
              "(hint: rerun with -v for the traceback; please report it)", file=sys.stderr)
        return FAILED


def report(prog: str, exc: UserError | OSError) -> int:
    """Print ``exc`` as ``PROG: error: ...`` on one line; the exit code for it."""
    if isinstance(exc, UserError):
        text = exc.one_line()
    else:  # a path the checks did not foresee (a name too long, a loop, ...)
        where = f"{exc.filename}: " if exc.filename else ""
        text = f"{where}{exc.strerror or exc}"
    print(f"{prog}: error: {text}", file=sys.stderr)
    return FAILED


def interrupted(prog: str) -> int:
    print(f"{prog}: interrupted", file=sys.stderr)
    return FAILED


def main_of(prog: str, module: str) -> int:
    """``module.main()``, with Ctrl-C during its imports (a good part of a second) one line, not a traceback."""
    try:
        # __import__ imports as an import statement does, audit event included (importlib.import_module skips it).
        return int(__import__(module, fromlist=["main"]).main())
    except KeyboardInterrupt:
        return interrupted(prog)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse's own report is the whole usage text before the message: many lines for one mistake.
        raise UserError(f"{message} ({self.prog} --help lists the options)")


def nonempty_path(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path (an unset shell variable?)")
    return Path(text)


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def count(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_number(text: str) -> float:
    """A finite number > 0: no NaN, no infinity (they would end up in a JSON file that is then no JSON)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    if value < sys.float_info.min:  # subnormal: anything divided by it overflows to infinity
        raise argparse.ArgumentTypeError(f"{text!r} is too close to 0 (at least {sys.float_info.min:.3g})")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
