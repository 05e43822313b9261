"""What keeps a write of :mod:`common.atomic` whole: held signals and a directory lock.

While a write runs, SIGINT, SIGTERM and SIGHUP are held (main thread only): the
writer checks for them between steps (:func:`check_signals`) and rolls back, then
they go to the handler that was in place.  Writers sharing a directory are
serialized with ``flock`` on it (:func:`locked`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def held_signals() -> Iterator[list[int]]:
    pending: list[int] = []  # signals received while held, in order
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _HELD_SIGNALS:
            if signal.getsignal(signum) in (signal.SIG_IGN, None):  # ignored, or not set from Python: leave it
                continue
            previous[signum] = signal.signal(signum, lambda number, frame: pending.append(number))
    try:
        yield pending
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for number in dict.fromkeys(pending):
            signal.raise_signal(number)  # the restored handler acts now: KeyboardInterrupt, exit, ...


def check_signals(pending: list[int]) -> None:
    if pending:
        raise InterruptedError(errno.EINTR, f"interrupted by {signal.Signals(pending[0]).name}")


@contextmanager
def locked(directory: Path, pending: list[int]) -> Iterator[None]:
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield  # cannot lock here: writes still roll back, they are just not serialized
        return
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # another writer commits here: wait, but stay interruptible
                check_signals(pending)
                time.sleep(0.02)
            except OSError:
                break  # no flock on this file system
        yield
    finally:
        os.close(fd)
