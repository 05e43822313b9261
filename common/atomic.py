"""All-or-nothing file writes, shared by ``convert-model`` and ``partition-model``.

:func:`write_all_atomic` replaces a set of files so that, whether it returns,
raises or dies, the next run sees either all of the old files or all of the
new ones:

1. a journal naming every target, its temporary, its backup (when the target
   exists) and every directory to create is written, itself atomically, to
   the journal directory;
2. missing directories are created; each new file is staged beside its target
   (``.<name>.<pid>.<random>.tmp``), written and fsynced;
3. each target that exists is hard-linked to its backup (``...bak``);
4. the temporaries are renamed over their targets;
5. the journal is removed: the commit point.  Then the backups.

A failure before the commit point undoes what was done (old files back, new
ones and created directories removed) and raises.  A writer that dies mid-way
(SIGKILL, power loss) leaves its journal: the next write in that directory, or
:func:`recover`, rolls it back first and removes the temporaries and backups
of dead processes.  While a write runs, SIGINT, SIGTERM and SIGHUP are held
(main thread only) and acted on at the next step: the write is rolled back,
then the signal goes to the handler that was in place.  Writers sharing a
journal directory are serialized with ``flock`` on it.  A reader looking during
the renames can still see a mix: this is crash consistency, not isolation.

One file (:func:`write_atomic`) needs no journal or backup: one rename cannot
be split.  Several writers (the ranks of a distributed save) each :func:`stage`
their own files beside the targets; one of them then :func:`commit_staged` s
them all, with the same journal, and may remove stale files in the same
commit.  A staged temporary whose writer died is removed by the next write or
:func:`recover` there.  Failures raise ``OSError`` (``InterruptedError`` for a held signal
whose handler did not raise).
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from common.write_guard import check_signals, held_signals, locked

_JOURNAL = re.compile(r"^\.atomic-write\.(?P<pid>\d+)\.journal$")
_LEFTOVER = re.compile(r"^\..+\.(?P<pid>\d+)\.[0-9a-f]{8}\.(tmp|bak)$")
_MAX_JOURNAL_BYTES = 1 << 20


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, all or nothing."""
    write_all_atomic({path: data})


def write_all_atomic(files: Mapping[Path, bytes], root: Path | None = None) -> None:
    """Replace every file of ``files``, all or nothing.

    ``root`` holds the journal and must contain every target (default: their
    deepest common directory); a caller that reads the targets before writing
    should :func:`recover` it first.
    """
    if not files:
        return
    targets = {Path(os.path.abspath(path)): data for path, data in files.items()}
    for target in targets:
        if target.is_dir() and not target.is_symlink():  # os.replace would fail only after others were replaced
            raise IsADirectoryError(errno.EISDIR, "a directory is in the way", str(target))
    journal_dir = Path(os.path.abspath(root if root is not None else
                                       os.path.commonpath([target.parent for target in targets])))
    if any(journal_dir not in target.parents for target in targets):
        raise ValueError(f"write_all_atomic: every target must lie under {journal_dir}")
    with held_signals() as pending:
        above = _missing_dirs([journal_dir])
        try:
            for directory in above:
                os.mkdir(directory)
            with locked(journal_dir, pending):
                for directory in dict.fromkeys([journal_dir, *(target.parent for target in targets)]):
                    _clean(directory)
                _commit(targets, journal_dir, pending)
        except BaseException:
            _remove_empty_dirs(above)
            raise


def stage(target: Path, data: bytes | Callable[[Path], None]) -> Path:
    """Write ``data`` (fsynced) to a temporary beside ``target`` for a later :func:`commit_staged`; return its path.

    ``data`` may be a function writing the (created, empty) temporary itself: a
    large file then never sits in memory as bytes.
    """
    temp = _beside(Path(os.path.abspath(target)), "tmp")
    if isinstance(data, bytes):
        _stage(temp, data)
        return temp
    _stage(temp, b"")
    try:
        data(temp)
        fd = os.open(temp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def commit_staged(staged: Mapping[Path, Path], root: Path, remove: Iterable[Path] = ()) -> None:
    """Rename each temporary of ``staged`` (target -> what :func:`stage` returned, possibly in another process)
    over its target and remove the files of ``remove``, all or nothing; ``root`` holds the journal.

    On failure the temporaries are removed too: the writers stage again.
    """
    targets = {Path(os.path.abspath(target)): Path(os.path.abspath(temp)) for target, temp in staged.items()}
    removed = [Path(os.path.abspath(path)) for path in remove if os.path.lexists(path)]
    journal_dir = Path(os.path.abspath(root))
    if any(journal_dir not in target.parents for target in [*targets, *removed]):
        raise ValueError(f"commit_staged: every target must lie under {journal_dir}")
    for target in [*targets, *removed]:
        if target.is_dir() and not target.is_symlink():
            raise IsADirectoryError(errno.EISDIR, "a directory is in the way", str(target))
    with held_signals() as pending, locked(journal_dir, pending):
        keep = set(targets.values())  # staged by writers that may live on other hosts: never a dead leftover
        for directory in dict.fromkeys([journal_dir, *(target.parent for target in [*targets, *removed])]):
            _clean(directory, keep)
        plan = [_Entry(target, temp, _beside(target, "bak") if os.path.lexists(target) else None)
                for target, temp in targets.items()]
        plan += [_Entry(target, None, _beside(target, "bak")) for target in removed if target not in targets]
        _commit_plan(plan, [], journal_dir, pending)


def recover(directory: Path) -> None:
    """Roll back a write that died in ``directory``; remove dead writers' temporaries and backups there."""
    directory = Path(os.path.abspath(directory))
    if not directory.is_dir():
        return
    with held_signals() as pending, locked(directory, pending):
        _clean(directory)


def is_temporary(name: str) -> bool:
    """Whether a file name is one of this module's temporaries, backups or journals."""
    return bool(_LEFTOVER.match(name) or _JOURNAL.match(name))


# -- the write ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    target: Path
    temp: Path | None  # None: the target is removed
    backup: Path | None  # planned only for a target that exists


def _commit(targets: dict[Path, bytes], journal_dir: Path, pending: list[int]) -> None:
    plan = [_Entry(target, _beside(target, "tmp"), _beside(target, "bak") if os.path.lexists(target) else None)
            for target in targets]
    new_dirs = _missing_dirs([target.parent for target in targets])
    _commit_plan(plan, new_dirs, journal_dir, pending, _writer(targets))


def _writer(targets: dict[Path, bytes]) -> Callable[[_Entry], None]:
    def write(entry: _Entry) -> None:
        assert entry.temp is not None
        _stage(entry.temp, targets[entry.target])
    return write


def _commit_plan(plan: list[_Entry], new_dirs: list[Path], journal_dir: Path, pending: list[int],
                 write: Callable[[_Entry], None] | None = None) -> None:
    """Stage (``write``, unless already staged), back up, rename (or remove) every entry; undo all on failure."""
    journal = _write_journal(journal_dir, plan, new_dirs) if len(plan) > 1 else None
    try:
        for directory in new_dirs:
            os.mkdir(directory)
        if write is not None:
            for entry in plan:
                check_signals(pending)
                write(entry)
        for entry in plan:
            if entry.backup is not None:
                _backup(entry.target, entry.backup)
        for entry in plan:
            check_signals(pending)
            if entry.temp is None:
                os.unlink(entry.target)
            else:
                os.replace(entry.temp, entry.target)
        for directory in dict.fromkeys(entry.target.parent for entry in plan):
            _fsync_dir(directory)
    except BaseException:
        try:
            _undo(plan, new_dirs)
            if journal is not None:
                journal.unlink()
        except OSError:
            pass  # the journal stays: the next write here rolls back
        raise
    if journal is not None:
        journal.unlink()  # committed
        _fsync_dir(journal_dir)
    for entry in plan:
        if entry.backup is not None:
            entry.backup.unlink(missing_ok=True)


def _undo(plan: list[_Entry], new_dirs: list[Path]) -> None:
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
    _remove_empty_dirs(new_dirs)


def _beside(target: Path, suffix: str) -> Path:
    # A long name is cut so that the temporary's name stays within NAME_MAX.
    return target.with_name(f".{target.name[:120]}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}")


def _stage(temp: Path, data: bytes) -> None:
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)  # the umask applies
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _backup(target: Path, backup: Path) -> None:
    try:
        os.link(target, backup, follow_symlinks=False)
    except OSError:  # no hard links on this file system
        shutil.copy2(target, backup, follow_symlinks=False)


def _missing_dirs(directories: list[Path]) -> list[Path]:
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


def _remove_empty_dirs(created: list[Path]) -> None:
    for directory in reversed(created):
        with suppress(OSError):
            directory.rmdir()


def _fsync_dir(directory: Path) -> None:
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# -- the journal and what dead writers left ---------------------------------------------------------------


def _write_journal(journal_dir: Path, plan: list[_Entry], new_dirs: list[Path]) -> Path:
    rel = lambda path: os.path.relpath(path, journal_dir)  # noqa: E731 (the tree may move before recovery)
    record = {
        "entries": [{"target": rel(e.target), "temp": rel(e.temp) if e.temp else None,
                     "backup": rel(e.backup) if e.backup else None}
                    for e in plan],
        "created": [rel(d) for d in new_dirs],
    }
    journal = journal_dir / f".atomic-write.{os.getpid()}.journal"
    temp = _beside(journal, "tmp")
    _stage(temp, json.dumps(record).encode())
    os.replace(temp, journal)
    _fsync_dir(journal_dir)
    return journal


def _clean(directory: Path, keep: set[Path] | frozenset[Path] = frozenset()) -> None:
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
        plan = [_Entry(_inside(base, e["target"]), _inside(base, e["temp"]) if e["temp"] is not None else None,
                       _inside(base, e["backup"]) if e["backup"] is not None else None) for e in record["entries"]]
        new_dirs = [_inside(base, d) for d in record["created"]]
    except (OSError, ValueError, KeyError, TypeError):
        journal.unlink(missing_ok=True)  # not one of ours, or unreadable: nothing to roll back with
        return
    # Only names this module gives, beside their target: a forged journal cannot reach other files.
    plan = [e for e in plan if (e.temp or e.backup) is not None
            and all(_LEFTOVER.match(p.name) and p.parent == e.target.parent for p in (e.temp, e.backup) if p is not None)]
    _undo(plan, [])
    journal.unlink()
    _remove_empty_dirs(new_dirs)
    _fsync_dir(base)


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
