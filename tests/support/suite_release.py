"""The transformers release the suite imports in-process, and the environment a user's own commands run in.

The set-up environment's installed transformers is the newest verified release (what a user trains with);
the suite's in-process tests were written against 4.5.1, so tests/conftest.py puts 4.5.1's side-by-side
install (``.venv/transformers/4.5.1``) first on this process's path and on the PYTHONPATH its children
inherit.  The tests of the default environment run their commands in :func:`user_environment`, without it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from families.installed import NO_TOKENIZERS, SIDE_BY_SIDE

SUITE_RELEASE = "4.5.1"
SUITE_INSTALL = SIDE_BY_SIDE / SUITE_RELEASE
# scripts/setup.sh puts .venv/tokenizers (0.23) on every venv process's path but where NO_TOKENIZERS is set:
# 4.5.1's import-time check refuses any tokenizers but 0.10.x, which has no wheel for current Pythons.
TOKENIZERS_DIR = SIDE_BY_SIDE.parent / "tokenizers"


def put_first() -> None:
    """Import transformers 4.5.1 here and in every child that inherits this environment."""
    if not (SUITE_INSTALL / "transformers").is_dir():
        raise RuntimeError(f"no transformers {SUITE_RELEASE} in {SUITE_INSTALL}: run bash scripts/setup.sh")
    sys.path[:] = [str(SUITE_INSTALL), *(entry for entry in sys.path if Path(entry) != TOKENIZERS_DIR)]
    os.environ[NO_TOKENIZERS] = "1"
    inherited = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(SUITE_INSTALL), *([inherited] if inherited else [])])


def user_environment() -> dict[str, str]:
    """This process's environment as a user's shell has it: no PYTHONPATH, so the installed release imports."""
    return {name: value for name, value in os.environ.items() if name not in ("PYTHONPATH", NO_TOKENIZERS)}
