"""A user's own environment, built fresh: a virtual environment with the pinned torch and the newest verified
transformers from the registry, and this project ``pip install``-ed into it (not editable).

The releases are read where they are decided: torch from scripts/setup.sh's pin, transformers from the
recipes' verified releases, installed as converter/installs.py installs any release (``--no-deps`` with its
era's requirements: a release's own requirements may name packages the registry here lacks).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from support.suite_release import user_environment

from common.versions import Release
from converter import installs

# What transformers' model code imports in every era besides the era's own pins (scripts/transformers_releases.txt).
SHARED = ("numpy", "regex", "tqdm", "filelock", "requests", "packaging", "pyyaml")


def pinned_torch() -> str:
    """The torch release scripts/setup.sh pins."""
    found = re.search(r"^TORCH_VERSION=(\S+)$", (REPO / "scripts" / "setup.sh").read_text(), re.MULTILINE)
    assert found, "scripts/setup.sh pins no TORCH_VERSION"
    return found.group(1)


def newest_verified() -> str:
    return max(installs.verified_releases(), key=Release.parse)


def run(command: list[str | Path], cwd: Path, env: dict[str, str], timeout: int = 900) -> str:
    done = subprocess.run([str(word) for word in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def checkout_copy(target: Path) -> Path:
    """The checkout's files (tracked, and new ones git does not ignore) under ``target``: a clean tree to install."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def build(root: Path) -> Path:
    """The fresh environment under ``root`` (its bin/ directory), the project installed from a copy of it."""
    env = user_environment()
    venv = root / "venv"
    run([sys.executable, "-m", "venv", venv], root, env)
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    run([*pip, f"torch=={pinned_torch()}"], root, env)  # alone and pinned: an unpinned one would pull CUDA's
    release = installs.release_for(newest_verified(), installs.verified_releases())
    run([*pip, "--no-deps", *release.pip_requirements], root, env)
    run([*pip, *SHARED], root, env)
    run([*pip, f"{checkout_copy(root / 'src')}[models]"], root, env)
    return venv / "bin"
