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
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from common.journal import (
    Entry,
    backup,
    beside,
    clean,
    fsync_dir,
    is_temporary,
    missing_dirs,
    remove_empty_dirs,
    undo,
    write_file,
    write_journal,
)
from common.write_guard import check_signals, held_signals, locked

__all__ = ["cannot_create_in", "commit_staged", "is_temporary", "recover", "stage", "write_all_atomic", "write_atomic"]



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
        above = missing_dirs([journal_dir])
        try:
            for directory in above:
                os.mkdir(directory)
            with locked(journal_dir, pending):
                for directory in dict.fromkeys([journal_dir, *(target.parent for target in targets)]):
                    clean(directory)
                _commit(targets, journal_dir, pending)
        except BaseException:
            remove_empty_dirs(above)
            raise


def stage(target: Path, data: bytes | Callable[[Path], None]) -> Path:
    """Write ``data`` (fsynced) to a temporary beside ``target`` for a later :func:`commit_staged`; return its path.

    ``data`` may be a function writing the (created, empty) temporary itself: a
    large file then never sits in memory as bytes.
    """
    temp = beside(Path(os.path.abspath(target)), "tmp")
    if isinstance(data, bytes):
        write_file(temp, data)
        return temp
    write_file(temp, b"")
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
            clean(directory, keep)
        plan = [Entry(target, temp, beside(target, "bak") if os.path.lexists(target) else None)
                for target, temp in targets.items()]
        plan += [Entry(target, None, beside(target, "bak")) for target in removed if target not in targets]
        _commit_plan(plan, [], journal_dir, pending)


def recover(directory: Path) -> None:
    """Roll back a write that died in ``directory``; remove dead writers' temporaries and backups there."""
    directory = Path(os.path.abspath(directory))
    if not directory.is_dir():
        return
    with held_signals() as pending, locked(directory, pending):
        clean(directory)


# -- the write ------------------------------------------------------------------------------------------------


def _commit(targets: dict[Path, bytes], journal_dir: Path, pending: list[int]) -> None:
    plan = [Entry(target, beside(target, "tmp"), beside(target, "bak") if os.path.lexists(target) else None)
            for target in targets]
    new_dirs = missing_dirs([target.parent for target in targets])
    _commit_plan(plan, new_dirs, journal_dir, pending, _writer(targets))


def _writer(targets: dict[Path, bytes]) -> Callable[[Entry], None]:
    def write(entry: Entry) -> None:
        assert entry.temp is not None
        write_file(entry.temp, targets[entry.target])
    return write


def _commit_plan(plan: list[Entry], new_dirs: list[Path], journal_dir: Path, pending: list[int],
                 write: Callable[[Entry], None] | None = None) -> None:
    """Stage (``write``, unless already staged), back up, rename (or remove) every entry; undo all on failure."""
    journal = write_journal(journal_dir, plan, new_dirs) if len(plan) > 1 else None
    try:
        for directory in new_dirs:
            os.mkdir(directory)
        if write is not None:
            for entry in plan:
                check_signals(pending)
                write(entry)
        for entry in plan:
            if entry.backup is not None:
                backup(entry.target, entry.backup)
        for entry in plan:
            check_signals(pending)
            if entry.temp is None:
                os.unlink(entry.target)
            else:
                os.replace(entry.temp, entry.target)
        for directory in dict.fromkeys(entry.target.parent for entry in plan):
            fsync_dir(directory)
    except BaseException:
        try:
            undo(plan, new_dirs)
            if journal is not None:
                journal.unlink()
        except OSError:
            pass  # the journal stays: the next write here rolls back
        raise
    if journal is not None:
        journal.unlink()  # committed
        fsync_dir(journal_dir)
    for entry in plan:
        if entry.backup is not None:
            entry.backup.unlink(missing_ok=True)


def cannot_create_in(directory: Path) -> str | None:
    """Why no file can be created in the existing ``directory`` (the system's reason), or None where one can.

    Tried, not read off the mode bits: root passes every ``os.access`` test, yet a read-only mount or a kernel
    file system (``/sys``) refuses it all the same.  The probe is removed at once.
    """
    try:
        fd, name = tempfile.mkstemp(dir=directory, prefix=".write-probe-")
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(name)
    return None
