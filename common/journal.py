"""The journal of an all-or-nothing write and the file-system steps it is made of (see :mod:`common.atomic`).

A write names every target, its staged temporary and its backup in a journal before it changes anything;
a writer that dies leaves it, and the next write in that directory (or ``recover``) rolls it back with
:func:`clean`.  Temporaries and backups carry the writer's pid, so only dead writers' files are removed.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

_JOURNAL = re.compile(r"^\.atomic-write\.(?P<pid>\d+)\.journal$")
_LEFTOVER = re.compile(r"^\..+\.(?P<pid>\d+)\.[0-9a-f]{8}\.(tmp|bak)$")
_MAX_JOURNAL_BYTES = 1 << 20


@dataclass(frozen=True)
class Entry:
    target: Path
    temp: Path | None  # None: the target is removed
    backup: Path | None  # planned only for a target that exists


def is_temporary(name: str) -> bool:
    """Whether a file name is one of this module's temporaries, backups or journals."""
    return bool(_LEFTOVER.match(name) or _JOURNAL.match(name))


def undo(plan: list[Entry], new_dirs: list[Path]) -> None:
    """Put back what ``plan`` changed, whatever step it reached (also for a dead writer's journal)."""
    for entry in reversed(plan):
        if entry.backup is None:
            if entry.temp is not None and not os.path.lexists(entry.temp):
                entry.target.unlink(missing_ok=True)  # renamed into place, or never staged: it did not exist
        elif os.path.lexists(entry.backup):
            os.replace(entry.backup, entry.target)  # the old file, whether it was renamed over (removed) or not
            entry.backup.unlink(missing_ok=True)  # rename() between two links to one file does nothing
        if entry.temp is not None:
            entry.temp.unlink(missing_ok=True)
    remove_empty_dirs(new_dirs)


def beside(target: Path, suffix: str) -> Path:
    # A long name is cut so that the temporary's name stays within NAME_MAX.
    return target.with_name(f".{target.name[:120]}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}")


def write_file(temp: Path, data: bytes) -> None:
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def backup(target: Path, backup: Path) -> None:
    try:
        os.link(target, backup, follow_symlinks=False)
    except OSError:  # no hard links on this file system
        shutil.copy2(target, backup, follow_symlinks=False)


def missing_dirs(directories: list[Path]) -> list[Path]:
    """The directories to create, parents first; a file in the way is an error now, not half-way."""
    missing: list[Path] = []
    for directory in directories:
        chain = []
        while not directory.is_dir() and directory not in missing:
            if os.path.lexists(directory):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(directory))
            chain.append(directory)
            if directory.parent == directory:
                break
            directory = directory.parent
        missing += reversed(chain)
    return missing


def remove_empty_dirs(created: list[Path]) -> None:
    for directory in reversed(created):
        with suppress(OSError):
            directory.rmdir()


def fsync_dir(directory: Path) -> None:
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_journal(journal_dir: Path, plan: list[Entry], new_dirs: list[Path]) -> Path:
    rel = lambda path: os.path.relpath(path, journal_dir)  # noqa: E731 (the tree may move before recovery)
    record = {
        "entries": [{"target": rel(e.target), "temp": rel(e.temp) if e.temp else None,
                     "backup": rel(e.backup) if e.backup else None}
                    for e in plan],
        "created": [rel(d) for d in new_dirs],
    }
    journal = journal_dir / f".atomic-write.{os.getpid()}.journal"
    temp = beside(journal, "tmp")
    write_file(temp, json.dumps(record).encode())
    os.replace(temp, journal)
    fsync_dir(journal_dir)
    return journal


def clean(directory: Path, keep: set[Path] | frozenset[Path] = frozenset()) -> None:
    """Roll back dead writers' journals in ``directory``, then remove their temporaries and backups (not ``keep``)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = _JOURNAL.match(name)
        if match and not _alive(int(match["pid"])):
            _roll_back(directory / name)
    for name in names:
        match = _LEFTOVER.match(name)
        if match and not _alive(int(match["pid"])) and directory / name not in keep:
            with suppress(OSError):
                (directory / name).unlink()


def _roll_back(journal: Path) -> None:
    base = journal.parent
    try:
        with open(journal, "rb") as handle:
            record = json.loads(handle.read(_MAX_JOURNAL_BYTES))
        plan = [Entry(_inside(base, e["target"]), _inside(base, e["temp"]) if e["temp"] is not None else None,
                       _inside(base, e["backup"]) if e["backup"] is not None else None) for e in record["entries"]]
        new_dirs = [_inside(base, d) for d in record["created"]]
    except (OSError, ValueError, KeyError, TypeError):
        journal.unlink(missing_ok=True)  # not one of ours, or unreadable: nothing to roll back with
        return
    # Only names this module gives, beside their target: a forged journal cannot reach other files.
    plan = [e for e in plan if (e.temp or e.backup) is not None
            and all(_LEFTOVER.match(p.name) and p.parent == e.target.parent for p in (e.temp, e.backup) if p is not None)]
    undo(plan, [])
    journal.unlink()
    remove_empty_dirs(new_dirs)
    fsync_dir(base)


def _inside(base: Path, relative: object) -> Path:
    """``base / relative``, refusing what no journal of this module holds (absolute or escaping paths)."""
    if not isinstance(relative, str) or os.path.isabs(relative) or ".." in Path(relative).parts:
        raise ValueError(f"journal path {relative!r} leaves {base}")
    return base / relative


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except OverflowError:
        return False  # no process has such a number
    return True
