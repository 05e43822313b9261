"""The errors both CLIs report as one line, and the signals they turn into a clean stop."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class UserError(Exception):
    """A user-facing failure: printed as one line, exit code 2."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def one_line(self) -> str:
        text = str(self).replace("\n", " ")
        return f"{text} (hint: {self.hint})" if self.hint else text


class Interrupted(BaseException):
    """SIGTERM or SIGHUP, raised so that every ``with``/``finally`` cleans up (like KeyboardInterrupt)."""


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Interrupted`, so temporary files and child processes are cleaned up."""
    def raise_interrupted(signum: int, frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) == signal.SIG_DFL:  # nohup's SIG_IGN stays
                previous[signum] = signal.signal(signum, raise_interrupted)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
