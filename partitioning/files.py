"""The files partition-model reads from and writes for its user: capped reads, destinations checked up front.

Every file a user names is read through :func:`read_text` (a size cap, regular
files and pipes only, UTF-8), so ``/dev/zero``, a directory or a binary file
is one line, not a traceback or a hang.  Every file a command writes is
checked by :func:`check_destinations` before any slow work starts, and all of
them are written together by :func:`write_outputs`, all or nothing
(:mod:`common.atomic`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from common.atomic import cannot_create_in, write_all_atomic
from common.errors import UserError
from common.files import read_text
from partitioning.plan import Plan

MAX_PLAN_BYTES = 16 << 20


def read_plan(path: Path) -> Plan:
    """A plan file a user names (read capped, checked field by field)."""
    return Plan.from_json(read_text(path, "plan", MAX_PLAN_BYTES))


def check_destinations(paths: Mapping[str, Path], inputs: Mapping[str, Path | None] | None = None) -> None:
    """Every output (``{"--flag": path}``) can be written: checked before the slow work, with one-line errors.

    Not a directory, no file where a directory must be, no two flags naming
    one file, none naming one of the ``inputs`` (the command would replace
    what it reads), and a writable directory above them all for the journal
    of the all-or-nothing write.
    """
    for source, path in (inputs or {}).items():
        if path is None:
            continue
        target = os.path.realpath(path)
        clash = next((flag for flag, output in paths.items() if os.path.realpath(output) == target), None)
        if clash is not None:
            raise UserError(f"{clash} {paths[clash]} is the {source} file this command reads: give another path")
    seen: dict[str, str] = {}
    for flag, path in paths.items():
        if not str(path).strip():
            raise UserError(f"{flag}: empty path")
        target = os.path.realpath(path)
        if target in seen:
            raise UserError(f"{seen[target]} and {flag} name the same file {path}: give them different paths")
        seen[target] = flag
        if os.path.isdir(target):
            raise UserError(f"{flag} {path} is a directory: name a file (e.g. {Path(path) / _default_name(flag)})")
        parent = Path(target).parent
        while not parent.exists():  # directories that are missing are created by the write
            parent = parent.parent
        if not parent.is_dir():
            raise UserError(f"{flag} {path}: {parent} is not a directory")
        reason = cannot_create_in(parent)
        if reason is not None:
            raise UserError(f"{flag} {path}: {parent} is not writable ({reason})")
    root = _journal_dir(list(paths.values()))
    existing = root
    while not existing.exists():
        existing = existing.parent
    if cannot_create_in(existing) is not None:
        raise UserError(f"the outputs ({', '.join(str(p) for p in paths.values())}) are written together, with a "
                        f"journal in their common directory {root}, which is not writable: put them under one "
                        f"writable directory")


def _default_name(flag: str) -> str:
    return {"--output": "plan.json", "--plot": "plan.png", "--module-to-device": "placement.json",
            "--ipu-code": "ipu_parallelize.py", "--timeline": "timeline.json", "--ipu-options": "poptorch_options.conf"}.get(flag, "out")


def _journal_dir(paths: Sequence[Path]) -> Path:
    return Path(os.path.commonpath([os.path.dirname(os.path.realpath(path)) for path in paths]))


def write_outputs(files: Mapping[Path, bytes]) -> None:
    """Write every output of one command together: all of them, or (on any failure) none."""
    if files:
        write_all_atomic({Path(os.path.realpath(path)): data for path, data in files.items()},
                         root=_journal_dir(list(files)))
