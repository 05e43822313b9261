"""Reading the files a user names: capped, regular files and pipes only, UTF-8, JSON as the standard defines it.

Every file a user names is read through :func:`read_text` (or :func:`read_capped` for bytes), so
``/dev/zero``, a directory or a binary file is one line, not a traceback or a hang.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from common.errors import UserError

MAX_SOURCE_BYTES = 16 << 20

def read_capped(path: Path, limit: int = MAX_SOURCE_BYTES) -> bytes:
    """The bytes of a regular file (or a pipe) of at most ``limit`` bytes; ``OSError`` otherwise.

    Never blocks on or reads without end from a device: ``/dev/zero`` is refused, not read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit // 1024} KiB, too large for a source file", str(path))
    return data


def read_text(path: Path, what: str, limit: int) -> str:
    """The UTF-8 text of the user's file ``path`` (``what`` names it in errors), at most ``limit`` bytes, without
    a leading byte order mark."""
    try:
        data = read_capped(path, limit)
    except OSError as exc:
        reason = (f"larger than {limit // 1024} KiB, too large for {what}" if exc.errno == errno.EFBIG
                  else exc.strerror or str(exc))
        raise UserError(f"cannot read {what} {path}: {reason}") from None
    try:
        # a byte order mark (what Windows editors write first) is no text: it would be part of the first word
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") \
            from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str) -> Any:
    """JSON as the standard defines it: ``NaN`` and ``Infinity`` (which Python's json accepts) are errors."""
    return json.loads(text, parse_constant=_no_constant)


def read_json_object(path: Path, what: str, limit: int) -> dict[str, Any]:
    """The JSON object in the user's file ``path``."""
    text = read_text(path, what, limit)
    try:
        data = parse_json(text)
    except ValueError as exc:
        raise UserError(f"{what} {path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} must be a JSON object, not {type(data).__name__}")
    return data
