"""A process that runs code against one side-by-side transformers release (.venv/transformers/<release>).

The caller starts it with :func:`environment`; the process checks first thing, with
:func:`wrong_release`, that it imported exactly that release and not the one installed in .venv.
"""

from __future__ import annotations

import os
import subprocess
from functools import cache
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
ROTATION = "HF_PIPELINE_ROTATION"  # set: the run index to rotate by (to reproduce another run's choice)


@cache
def run_index() -> int:
    """This run's place in the suite's rotation from one CI run to the next: ``HF_PIPELINE_ROTATION`` when set, else
    the checkout's commit count (every submission moves it on), else 0 (no git)."""
    if os.environ.get(ROTATION, "").isdigit():
        return int(os.environ[ROTATION])
    try:
        done = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return int(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip().isdigit() else 0


def suite_families(families: list[str], release: str, releases: list[str], run: int | None = None,
                   every: tuple[str, ...] = ()) -> list[str]:
    """The families of ``families`` (those committed at ``release``, one of a worker's ``releases``) the suite
    checks there: all at the newest and at ``every``; at the others one, the next one along the releases and from
    one run to the next (``run``: default :func:`run_index`), so that every release is checked in every run, every
    family at the newest, and each (release, family) once in as many runs as the release has families."""
    position = rotation(release, releases)
    if position is None or release in every:
        return families
    ordered = sorted(families)
    return [ordered[(position + (run_index() if run is None else run)) % len(ordered)]]


def exports_this_run(release: str, releases: list[str], run: int | None = None) -> bool:
    """Whether ``release`` exports in this run: the newest always, the others every other run, half of them each
    run (alternating along the releases).  Exporting is most of a worker's time; scripts/release_table.py exports
    every release in both modes."""
    position = rotation(release, releases)
    return position is None or (position + (run_index() if run is None else run)) % 2 == 0


def rotation(release: str, releases: list[str]) -> int | None:
    """``release``'s position among ``releases`` in version order, or None for the newest: what the suite rotates
    by (the newest runs everything)."""
    from common.versions import Release

    ordered = sorted(releases, key=Release.parse)
    position = ordered.index(release)
    return None if position == len(ordered) - 1 else position


def suite_checks(checks: tuple[str, ...], release: str, releases: list[str], run: int | None = None
                 ) -> tuple[str, ...]:
    """The checks the suite runs at ``release``, one of a worker's ``releases``: every check at the newest; at the
    others every check but the exports where :func:`exports_this_run` says no, and one export mode where it says
    yes, strict and non-strict alternating along the exporting releases and from run to run.  Both modes are run
    at every release by scripts/release_table.py (the published table)."""
    position = rotation(release, releases)
    if position is None:
        return checks
    run = run_index() if run is None else run
    if not exports_this_run(release, releases, run):
        return tuple(check for check in checks if check not in EXPORT_MODES)
    dropped = EXPORT_MODES[1 - (position // 2 + run // 2) % 2]
    return tuple(check for check in checks if check != dropped)


def picks(release: str, releases: list[str], run: int | None = None) -> dict[str, int]:
    """Which of each family's configs the stateless check, and which of its classes a non-strict export, takes at
    ``release`` in the suite: all (no pick) at the newest; at the others the one at the release's position plus the
    run's index, so that both rotate along the releases and from one run to the next."""
    position = rotation(release, releases)
    run = run_index() if run is None else run
    return {} if position is None else {"stateless": position + run, "export-non-strict": position // 2 + run}
