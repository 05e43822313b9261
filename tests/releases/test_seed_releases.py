"""Every committed GPT-2, BERT, RoBERTa and BART package of a release other than 4.5.1 against stock of its release.

One worker process per release checks the seed families committed for it (every one at the newest release, one at
each other, the next along the releases and from run to run: release_process.suite_families;
tests/support/seed_release_worker.py:
eval, train loss and every gradient, state-dict keys, stateless, fx on two shapes, train-mode graph, export strict
and non-strict with dynamic sizes; stateless and non-strict exports take every config and class at the newest
release, one per family description at the others, rotating: release_process.picks, and the trained all-MiniLM-L6-v2 under BERT's classifier head on real text; the suite runs one export mode per release but the newest, alternating:
release_process.suite_checks), with PYTHONPATH set to that release's side-by-side install. 4.5.1, the release
installed in .venv, is checked in this process by tests/models/. A package committed without its stock install
fails here; nothing is skipped. That each package is what the converter writes is
tests/releases/test_committed_packages.py's (one --check-all).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_script
from support import REPO
from support.release_process import picks, suite_checks, suite_families
from support.seed_release_worker import CHECKS, run_in_subprocess
from support.seed_releases import FAMILIES

installer = load_script("install_releases")
GENERATED = REPO / "generated_models"
IN_VENV = "4.5.1"


def committed() -> dict[str, list[str]]:
    """release -> the seed families committed for it (4.5.1 excluded: tests/models/ checks it)."""
    found: dict[str, list[str]] = {}
    for family in FAMILIES:
        for package in sorted((GENERATED / family).iterdir()):
            release = package.name[1:].replace("_", ".")
            if package.is_dir() and package.name.startswith("v") and release != IN_VENV:
                found.setdefault(release, []).append(family)
    return found


COMMITTED = committed()


def failures(record: dict) -> list[str]:
    return [f"{family}/{check}[{case}]: {message}" for family, checks in record["families"].items()
            for check, result in checks.items() for case, message in result["failures"].items()]


def run_release(release: str, families: list[str], out: Path, **options: object) -> tuple[int, dict | None, str]:
    listed = {r.version: r for r in installer.read_releases()}
    assert release in listed and installer.is_installed(listed[release]), (
        f"no stock install of transformers {release}: run bash scripts/setup.sh")
    return run_in_subprocess(release, installer.install_dir(release), families, out, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("release", sorted(COMMITTED))
def test_generated_seed_families_equal_stock(release: str, tmp_path: Path) -> None:
    families = suite_families(COMMITTED[release], release, list(COMMITTED))
    checks = suite_checks(CHECKS, release, list(COMMITTED))
    code, record, stderr = run_release(release, families, tmp_path / "r.json", checks=",".join(checks),
                                       real_weights="bert" in families,
                                       picks=picks(release, list(COMMITTED)))
    assert record is not None, f"transformers {release}: the worker wrote no result (exit {code}): {stderr[-3000:]}"
    problems = failures(record)
    assert not problems and code == 0, f"transformers {release}: " + "\n".join(problems[:20])
    assert sorted(record["families"]) == sorted(families)
    assert all(tuple(ran) == checks and all(c["passed"] > 0 for c in ran.values())
               for ran in record["families"].values())
    if "bert" in families:  # all-MiniLM-L6-v2 under a new classifier head, on real text
        assert record["real-weights"]["ok"] and record["real-weights"]["gradients"] > 90, record["real-weights"]


def test_the_worker_reports_a_generated_model_that_differs(tmp_path: Path) -> None:
    """The harness can fail: GPT-2's attention scale off by a factor is caught in eval and train, while the
    state-dict keys match and fx (which compares the graph with the same module) passes (run on 4.5.1's package: the one every release's checks share)."""
    source = (GENERATED / "gpt2" / "v4_5_1" / "modeling_gpt2.py").read_text(encoding="utf-8")
    needle = "w = w / (torch.sym_float(v.size(-1)) ** 0.5)"
    assert source.count(needle) == 1, "the needle moved: pick another line of the attention"
    broken = tmp_path / "modeling_gpt2.py"
    broken.write_text(source.replace(needle, "w = w / (1.001 * torch.sym_float(v.size(-1)) ** 0.5)"), encoding="utf-8")
    code, record, stderr = run_release(IN_VENV, ["gpt2"], tmp_path / "r.json", checks="eval,train,state-dict,fx",
                                       generated={"gpt2": broken})
    assert code == 1 and record is not None, stderr[-2000:]
    checks = record["families"]["gpt2"]
    assert checks["state-dict"]["ok"] and checks["fx"]["ok"]
    assert not checks["eval"]["ok"] and not checks["train"]["ok"]
    assert all("differ" in m for m in checks["eval"]["failures"].values()), checks["eval"]["failures"]
