"""A process that runs code against one side-by-side transformers release (.venv/transformers/<release>).

The caller starts it with :func:`environment`; the process checks first thing, with
:func:`wrong_release`, that it imported exactly that release and not the one installed in .venv.
"""

from __future__ import annotations

import os
from pathlib import Path

from families.installed import tokenizers_hidden


def environment(install_dir: Path) -> dict[str, str]:
    """This process's environment, with PYTHONPATH the release's directory and nothing else."""
    return {**os.environ, **tokenizers_hidden(install_dir), "PYTHONPATH": str(install_dir), "OMP_NUM_THREADS": "1"}


def wrong_release(release: str, install_dir: Path) -> str | None:
    """Why the transformers this process imports is not ``release`` from ``install_dir``; None when it is."""
    import transformers

    location = Path(transformers.__file__).resolve()
    if transformers.__version__ == release and location.is_relative_to(install_dir.resolve()):
        return None
    return (f"imported transformers {transformers.__version__} from {location}, not {release} from {install_dir}: "
            f"run with PYTHONPATH={install_dir}")


EXPORT_MODES = ("export-strict", "export-non-strict")


def rotation(release: str, releases: list[str]) -> int | None:
    """``release``'s position among ``releases`` in version order, or None for the newest: what the suite rotates
    by (the newest runs everything)."""
    from common.versions import Release

    ordered = sorted(releases, key=Release.parse)
    position = ordered.index(release)
    return None if position == len(ordered) - 1 else position


def suite_checks(checks: tuple[str, ...], release: str, releases: list[str]) -> tuple[str, ...]:
    """The checks the suite runs at ``release``, one of a worker's ``releases``: every check at the newest; at the
    others one export mode, strict and non-strict alternating along the releases. Exporting is three quarters of a
    worker's time, so every release is still exported each CI run, and both modes are run at every release by
    scripts/release_table.py (the published table)."""
    position = rotation(release, releases)
    if position is None:
        return checks
    return tuple(check for check in checks if check != EXPORT_MODES[1 - position % 2])


def picks(release: str, releases: list[str]) -> dict[str, int]:
    """Which of each family's configs the stateless check, and which of its classes a non-strict export, takes at
    ``release`` in the suite: all (no pick) at the newest; at the others the config at the release's position, and
    the next class at each release that exports non-strict (every other one: suite_checks), so that both rotate
    along the releases."""
    position = rotation(release, releases)
    return {} if position is None else {"stateless": position, "export-non-strict": position // 2}
