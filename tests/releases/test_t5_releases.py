"""Every committed generated T5 release against stock transformers of that same release, each in its own process.

This process imports the transformers of .venv (4.5.1); other releases live side by side under
.venv/transformers/<release>/ (scripts/setup.sh, scripts/install_releases.py). The worker
(t5_release_worker.py) runs with PYTHONPATH set to one release's directory and checks it imported
exactly that release. A release committed under generated_models/t5/ without its stock install
fails here; nothing is skipped.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script
from support import REPO, SUPPORT
from support.release_process import suite_checks
from support.t5_release_worker import CHECKS, run_in_subprocess

from converter.recipes import load_recipes
from families.layout import version_dir

GENERATED = REPO / "generated_models" / "t5"
WORKER = SUPPORT / "t5_release_worker.py"
_SOURCE = re.compile(r"^# source: transformers (\S+), transformers/models/t5/modeling_t5\.py$", re.M)


installer = load_script("install_releases")


def committed_releases() -> dict[str, str | None]:
    """Package directory name -> the release its @generated header names (None: no readable header)."""
    found = {}
    for package in sorted(p for p in GENERATED.iterdir() if p.is_dir() and p.name.startswith("v")):
        module = package / "modeling_t5.py"
        match = _SOURCE.search(module.read_text(encoding="utf-8")[:2000]) if module.is_file() else None
        found[package.name] = match.group(1) if match else None
    return found


COMMITTED = committed_releases()


def run_worker(release: str, generated: Path, out: Path, checks: str | None = None) -> tuple[int, dict | None, str]:
    return run_in_subprocess(release, installer.install_dir(release), generated, out, checks)


def failures(record: dict) -> list[str]:
    return [f"{check}[{case}]: {message}" for check, result in record["checks"].items()
            for case, message in result["failures"].items()]


def test_the_committed_releases_are_found() -> None:
    assert "v4_5_1" in COMMITTED
    for package, release in COMMITTED.items():
        assert release is not None, f"generated_models/t5/{package}/modeling_t5.py has no @generated source header"
        assert version_dir(release) == package, f"generated_models/t5/{package} holds transformers {release}"


IN_VENV = "4.5.1"  # checked in this process by tests/models/ (test_t5_equivalence, test_t5_tracing, ...)
OTHER_RELEASES = sorted(r for r in COMMITTED.values() if r and r != IN_VENV)


@pytest.mark.parametrize("release", OTHER_RELEASES)
def test_generated_release_equals_stock(release: str, tmp_path: Path) -> None:
    """Eval, train loss and every gradient, stateless, fx, export (one mode per release but the newest, alternating:
    release_process.suite_checks), partition, FTPipe's tracer: see the worker. 4.5.1, the release .venv imports,
    is checked in this process by tests/models/ (as the seed families' is)."""
    listed = {r.version: r for r in installer.read_releases()}
    assert release in listed, (f"generated_models/t5/{version_dir(release)} is committed but transformers {release} is "
                               "not a verified release of a recipe, so CI never installs it")
    assert installer.is_installed(listed[release]), (
        f"no stock install of transformers {release} in {installer.install_dir(release)}: run bash scripts/setup.sh")
    checks = suite_checks(CHECKS, release, OTHER_RELEASES)
    returncode, record, stderr = run_worker(release, GENERATED / version_dir(release) / "modeling_t5.py",
                                            tmp_path / "result.json", ",".join(checks))
    assert record is not None, f"transformers {release}: the worker wrote no result (exit {returncode}): {stderr[-3000:]}"
    problems = failures(record)
    assert not problems and returncode == 0, f"transformers {release}: " + "\n".join(problems[:20])
    assert tuple(record["checks"]) == checks, "the worker ran another set of checks than it was given"


def test_the_worker_reports_a_generated_model_that_differs(tmp_path: Path) -> None:
    """The harness can fail: a generated file whose layer norm is off by a factor is caught, case by case."""
    release = COMMITTED["v4_5_1"]
    assert release is not None  # test_the_committed_releases_are_found
    source = (GENERATED / "v4_5_1" / "modeling_t5.py").read_text(encoding="utf-8")
    needle = "torch.rsqrt(variance + self.variance_epsilon)"
    assert source.count(needle) == 1
    broken = tmp_path / "modeling_t5.py"
    broken.write_text(source.replace(needle, "torch.rsqrt(variance + 2 * self.variance_epsilon)"), encoding="utf-8")
    returncode, record, stderr = run_worker(release, broken, tmp_path / "result.json", checks="eval,state-dict")
    assert returncode == 1 and record is not None, stderr[-2000:]
    assert record["checks"]["state-dict"]["ok"]
    eval_failures = record["checks"]["eval"]["failures"]
    assert len(eval_failures) == 12 and all("outputs differ" in m for m in eval_failures.values()), eval_failures


def test_the_worker_refuses_a_process_that_imported_another_release(tmp_path: Path) -> None:
    """Without PYTHONPATH the worker imports .venv's installed release, which is not the release it was asked to
    check."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(WORKER), "--release", "4.10.3", "--install-dir",
                           str(installer.install_dir("4.10.3")), "--generated",
                           str(GENERATED / "v4_5_1" / "modeling_t5.py"), "--json", str(tmp_path / "r.json"),
                           "--checks", "eval"], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2
    assert "imported transformers " in proc.stderr and "not 4.10.3 from" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "r.json").exists()


# -- the side-by-side installs and the pinned sources -------------------------------------------

def test_every_listed_release_is_installed() -> None:
    missing = [r.version for r in installer.read_releases() if not installer.is_installed(r)]
    assert not missing, f"transformers {', '.join(missing)} not installed under .venv/transformers: run bash scripts/setup.sh"


def pins() -> dict[tuple[str, str], dict[str, str]]:
    """(family, release) -> {member: sha256}: every recipe's verified releases, the one place pins live."""
    return {(family, release): members for family, recipe in load_recipes().items()
            for release, members in recipe.pins.items()}


@pytest.mark.parametrize(("family", "release"), sorted(pins()))
def test_installed_sources_match_their_pinned_sha256(family: str, release: str) -> None:
    """The installs are the converter's sources (--source-dir): they must be the released bytes."""
    root = installer.install_dir(release)
    for member, expected in pins()[family, release].items():
        data = (root / member).read_bytes()
        assert hashlib.sha256(data).hexdigest() == expected, f"{family}: transformers {release} {member}"
