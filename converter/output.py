"""convert-model's output directory: what may be written there, what is there now, and how it differs.

The conversion owns the generated package directory whole, but never a file
it did not write: these checks run before anything is written.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path, PurePosixPath

from common import generated
from common.atomic import is_temporary
from common.errors import UserError
from common.files import read_capped


def ensure_writable(root: Path) -> None:
    """Fail before the (slow) conversion when the output directory cannot be created or written."""
    existing = root
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot write to output directory {root}: {existing} is not a writable directory")


def diff(old: str, new: str, old_name: str, new_name: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        old_name, new_name))


def check_layout(root: Path, files: dict[PurePosixPath, str]) -> None:
    """Every path of the layout is free for a generated file: no file where a directory goes, or the reverse."""
    for rel in files:
        path = root
        for part in rel.parts[:-1]:
            path = path / part
            if os.path.lexists(path) and not path.is_dir():
                raise UserError(f"{path} is in the way: the generated layout needs a directory there")
        if (root / rel).is_dir():
            raise UserError(f"{root / rel} is a directory where a generated file goes")


def read_current(path: Path) -> str | None:
    try:
        return read_capped(path).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def refuse_foreign(root: Path, changed: dict[PurePosixPath, str], current: dict[PurePosixPath, str | None]) -> None:
    """Never replace a file convert-model did not write (``--output-dir .`` must not eat ./__init__.py)."""
    for rel in changed:
        path = root / rel
        # Read again when it was missing: a concurrent run may have written it meanwhile.
        text = current[rel] if current[rel] is not None else read_current(path)
        generated.refuse_foreign(path, "convert-model", "move it away or pass another --output-dir", text)


def extras(root: Path, files: dict[PurePosixPath, str]) -> list[Path]:
    """Files in the generated package directory (which the conversion owns whole) that it did not generate."""
    package = max((rel.parent for rel in files), key=lambda parent: len(parent.parts))
    expected = {root / rel for rel in files}
    found = []
    for directory, subdirs, names in os.walk(root / package):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        found += [Path(directory) / name for name in sorted(names)
                  if Path(directory) / name not in expected and not is_temporary(name)]
    return found
