"""The one rule both tools follow before replacing a file: only a file they generated, marked ``@generated``.

A generated file's first line carries ``@generated``; a user who edits it drops
that line (the files say so), and from then on the file is theirs: neither
``convert-model`` nor ``partition-model`` replaces it.
"""

from __future__ import annotations

import os
from pathlib import Path

from common.errors import UserError
from common.files import read_capped

MARK = "@generated"


def is_generated(text: str | None) -> bool:
    """``text`` (None: unreadable) is a file a tool generated and still owns: ``@generated`` on its first line."""
    return text is not None and MARK in text.partition("\n")[0]


def current_text(path: Path) -> str | None:
    """The text of ``path`` as it is now (None: missing, unreadable or not UTF-8)."""
    try:
        return read_capped(path).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def refuse_foreign(path: Path, tool: str, hint: str, text: str | None = None) -> None:
    """Raise unless ``path`` is missing or was generated (``text``: its content when already read)."""
    if not os.path.lexists(path):
        return
    if not is_generated(text if text is not None else current_text(path)):
        raise UserError(f"refusing to replace {path}: {tool} did not write it or it was edited since "
                        f"(no {MARK} line)", hint=hint)


def literal_text(text: str) -> str:
    """``text`` as it may stand in a generated file's comment or docstring: itself when plain, else its repr.

    A line break would end the comment and start a code line, a backslash makes
    an escape and triple quotes close the docstring: such text is written as a
    Python string literal, which shows every character and executes nothing.
    """
    plain = text.isprintable() and "\\" not in text and '"""' not in text and "'''" not in text
    if plain:
        return text
    quoted = repr(text)
    if quoted.startswith('"'):  # repr chose double quotes (the text has a ' but no "): use single ones
        quoted = "'" + quoted[1:-1].replace("'", "\\'") + "'"
    return "'" + quoted[1:-1].replace('"', '\\"') + "'"  # no " left to close a docstring
