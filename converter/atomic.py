"""All-or-nothing file writes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _temp_beside(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; the result should look like any file the user writes.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def write_atomic(path: Path, data: bytes) -> None:
    os.replace(_temp_beside(path, data), path)


def write_all_atomic(files: dict[Path, bytes]) -> None:
    """Stage every file next to its target first, then rename them all.

    If any staging step fails (unwritable directory, full disk) nothing is
    renamed, so no target is left half-updated.
    """
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files.items():
            staged.append((_temp_beside(path, data), path))
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)
