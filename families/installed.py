"""The transformers release this process imports, where other releases are, and the command that gets one.

All three commands run against the release the environment has: ``--version`` defaults to
:func:`default_release` (convert-model, partition-model; train-model takes the plan's), and a
command asked for another release refuses with :func:`other_release`, whose hint is the exact
way to get it (``PYTHONPATH=<absolute dir>`` before the command where a side-by-side install of
it is here, else ``pip install``).  Side-by-side installs (``converter.installs`` writes them) live in the
checkout's ``.venv/transformers/<release>/`` (``scripts/setup.sh``) and in convert-model's cache,
``<cache>/installs/<package>/<release>/``; the cache also holds the packages converted on first
use from an installed release nothing commits (:func:`user_models`).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from importlib import metadata
from pathlib import Path

from common.errors import UserError

CACHE_ENV = "CONVERT_MODEL_CACHE"
SIDE_BY_SIDE = Path(__file__).resolve().parents[1] / ".venv" / "transformers"  # scripts/setup.sh's releases
STAMP = ".installed"
# scripts/setup.sh puts its tokenizers (the newest release's) on every venv process's path unless this is set:
# a release older than the tokenizers wheels (4.5 - 4.20, whose side-by-side install has none of its own)
# refuses that tokenizers at import.
NO_TOKENIZERS = "HF_PIPELINE_NO_TOKENIZERS"  # a finished side-by-side install: its exact requirements, transformers first


def cache_dir() -> Path:
    """convert-model's cache: sources, side-by-side installs, and the packages converted on first use."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "convert-model"


def user_models(cache: Path | None = None) -> Path:
    """The models directory of the packages converted on first use (an installed release nothing commits)."""
    return (cache or cache_dir()) / "generated"


def install_roots(package: str, cache: Path | None = None) -> tuple[Path, ...]:
    """Where side-by-side installs of ``package`` are looked for: the cache's, then the setup's."""
    return ((cache or cache_dir()) / "installs" / package, SIDE_BY_SIDE)


def stamped_release(directory: Path) -> str | None:
    """The transformers release a finished install in ``directory`` holds (its stamp's first requirement)."""
    try:
        words = (directory / STAMP).read_text(encoding="utf-8").split()
    except OSError:
        return None
    return words[0].removeprefix("transformers==") if words and words[0].startswith("transformers==") else None


def side_by_side(package: str, version: str, cache: Path | None = None) -> Path | None:
    """A finished side-by-side install of ``package`` ``version`` here, or None."""
    if package != "transformers":  # side-by-side installs are transformers releases
        return None
    for root in install_roots(package, cache):
        if stamped_release(root / version) == version:
            return (root / version).absolute()
    return None


def release(package: str) -> tuple[str | None, str]:
    """The release of ``package`` the next ``import`` gives here, and where it is (None: none imports).

    Read from the metadata next to the package that import would find (PYTHONPATH first, as
    import does), so nothing is imported; a package already imported, or one without metadata
    beside it, answers with its own ``__version__``.
    """
    module = sys.modules.get(package)
    if module is None:
        try:
            spec = importlib.util.find_spec(package)  # a top-level package: found, not run
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        if not locations:
            return None, f"{package} is not installed"
        location = Path(locations[0])
        for dist in metadata.distributions(path=[str(location.parent)]):
            if (dist.metadata["Name"] or "").lower() == package:
                return dist.version, str(location)
        try:
            module = importlib.import_module(package)
        except Exception as exc:  # noqa: BLE001 (a package may fail to import any way; only its release matters)
            return None, f"{package} does not import ({type(exc).__name__}: {exc})"[:160]
    return str(getattr(module, "__version__", None) or "of unknown release"), str(getattr(module, "__file__", "?"))


def tokenizers_hidden(directory: Path) -> dict[str, str]:
    """The environment a process importing the install in ``directory`` adds: NO_TOKENIZERS where it has no
    tokenizers of its own (the venv's would be seen, and such a release refuses it at import)."""
    return {} if (directory / "tokenizers").is_dir() else {NO_TOKENIZERS: "1"}


def get_command(package: str, version: str) -> str:
    """The exact way to run a command with ``package`` ``version``, from any directory."""
    directory = side_by_side(package, version)
    if directory is not None:
        hide = "".join(f"{name}={value} " for name, value in tokenizers_hidden(directory).items())
        return f"{hide}PYTHONPATH={shlex.quote(str(directory))} before the command runs it with {package} {version}"
    return f"pip install {package}=={version}"


def default_release(package: str) -> str:
    """The release ``--version`` defaults to: the one that imports here."""
    found, where = release(package)
    if found is None:
        raise UserError(f"--version is needed: {where}",
                        hint=f"pip install {package}, or give the release with --version")
    return found


def other_release(package: str, version: str, what: str, instead: str | None = None) -> UserError:
    """``what`` needs ``package`` ``version`` and another one imports here: the error naming both, and the way.

    ``instead``: what works with the release installed here.
    """
    found, where = release(package)
    installed = f"{package} {found} ({where})" if found is not None else where
    return UserError(f"{what} needs {package} {version}, but the one that imports here is {installed}",
                     hint=get_command(package, version) + (f"; or {instead}" if instead else ""))
