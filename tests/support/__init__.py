"""What several test areas share: model builders, checks, stand-ins, and the workers run as scripts."""

import shutil
import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent
# The interpreter's own torchrun first: CI runs .venv/bin/python without activating the venv.
_SIBLING = Path(sys.executable).with_name("torchrun")
TORCHRUN = str(_SIBLING) if _SIBLING.exists() else (shutil.which("torchrun") or "torchrun")
