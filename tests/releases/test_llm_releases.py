"""Every committed generated LLM (Llama, Qwen2, Qwen3, Mistral, Gemma 3) against stock transformers of its release.

One worker process per release checks the families committed for it (every one at the newest release, one at each
other, the next along the releases and from run to run: release_process.suite_families;
tests/support/llm_release_worker.py:
eval, train loss and every gradient, stateless, fx, train-mode graph, export strict and non-strict: one export
mode per release but the newest, alternating, release_process.suite_checks, a non-strict export taking one class
and path per family there, rotating, every one at the newest: release_process.picks), with
PYTHONPATH set to that release's side-by-side install. A package committed without its stock install fails
here; nothing is skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import load_script
from support import REPO
from support.llm_release_worker import CHECKS, FAMILIES, run_in_subprocess
from support.release_process import picks, suite_checks, suite_families

installer = load_script("install_releases")
GENERATED = REPO / "generated_models"


def committed() -> dict[str, list[str]]:
    """release -> the LLM families committed for it."""
    found: dict[str, list[str]] = {}
    for family in FAMILIES:
        root = GENERATED / family
        for package in sorted(root.iterdir()) if root.is_dir() else ():
            if package.is_dir() and package.name.startswith("v"):
                found.setdefault(package.name[1:].replace("_", "."), []).append(family)
    return found


COMMITTED = committed()


def failures(record: dict) -> list[str]:
    return [f"{family}/{check}[{case}]: {message}" for family, checks in record["families"].items()
            for check, result in checks.items() for case, message in result["failures"].items()]


def test_the_committed_releases_are_found() -> None:
    assert "llama" in COMMITTED.get("5.23.0", []) and "llama" in COMMITTED.get("4.57.6", [])
    # Before masking_utils (4.53): the models build their own causal mask.
    assert {"llama", "qwen2", "qwen3", "mistral", "gemma3"} <= set(COMMITTED.get("4.51.3", []))
    assert {"llama", "qwen2", "mistral"} <= set(COMMITTED.get("4.46.3", []))  # Qwen3 is 4.51 on
    assert {"llama", "qwen2", "mistral"} <= set(COMMITTED.get("4.40.2", []))


@pytest.mark.parametrize("release", sorted(COMMITTED))
def test_generated_llms_equal_stock(release: str, tmp_path: Path) -> None:
    listed = {r.version: r for r in installer.read_releases()}
    assert release in listed and installer.is_installed(listed[release]), (
        f"no stock install of transformers {release}: run bash scripts/setup.sh")
    families = suite_families(COMMITTED[release], release, list(COMMITTED))
    checks = suite_checks(CHECKS, release, list(COMMITTED))
    code, record, stderr = run_in_subprocess(release, installer.install_dir(release), families, tmp_path / "r.json",
                                             checks=",".join(checks),
                                             pick=picks(release, list(COMMITTED)).get("export-non-strict"))
    assert record is not None, f"transformers {release}: the worker wrote no result (exit {code}): {stderr[-3000:]}"
    problems = failures(record)
    assert not problems and code == 0, f"transformers {release}: " + "\n".join(problems[:20])
    assert sorted(record["families"]) == sorted(families)
    assert all(tuple(ran) == checks for ran in record["families"].values())


def test_the_worker_reports_a_generated_model_that_differs(tmp_path: Path) -> None:
    """The harness can fail: an RMS norm off by a factor is caught in eval and train."""
    source = (GENERATED / "llama" / "v5_23_0" / "modeling_llama.py").read_text(encoding="utf-8")
    needle = "torch.rsqrt(variance + self.variance_epsilon)"
    assert source.count(needle) == 1
    broken = tmp_path / "modeling_llama.py"
    broken.write_text(source.replace(needle, "torch.rsqrt(variance + 2 * self.variance_epsilon)"), encoding="utf-8")
    code, record, stderr = run_in_subprocess("5.23.0", installer.install_dir("5.23.0"), ["llama"], tmp_path / "r.json",
                                             checks="eval,state-dict", generated={"llama": broken})
    assert code == 1 and record is not None, stderr[-2000:]
    checks = record["families"]["llama"]
    assert checks["state-dict"]["ok"] and not checks["eval"]["ok"]
    assert all("outputs differ" in m for m in checks["eval"]["failures"].values()), checks["eval"]["failures"]


def test_the_worker_reports_a_gemma3_that_ignores_its_sliding_window(tmp_path: Path) -> None:
    """Gemma 3's tiny configs mix sliding and full layers, the window shorter than the sequence: every layer
    given the full-attention mask is caught in eval (and the package is committed at both releases)."""
    assert {"4.57.6", "5.23.0"} <= {release for release, families in COMMITTED.items() if "gemma3" in families}
    source = (GENERATED / "gemma3" / "v5_23_0" / "modeling_gemma3.py").read_text(encoding="utf-8")
    needle = "attention_mask=causal_mask_mapping[self.config.layer_types[i]]"
    assert source.count(needle) == 1
    broken = tmp_path / "modeling_gemma3.py"
    broken.write_text(source.replace(needle, 'attention_mask=causal_mask_mapping["full_attention"]'), encoding="utf-8")
    code, record, stderr = run_in_subprocess("5.23.0", installer.install_dir("5.23.0"), ["gemma3"], tmp_path / "r.json",
                                             checks="eval,state-dict", generated={"gemma3": broken})
    assert code == 1 and record is not None, stderr[-2000:]
    checks = record["families"]["gemma3"]
    assert checks["state-dict"]["ok"] and not checks["eval"]["ok"]
    assert len(checks["eval"]["failures"]) == 4, checks["eval"]["failures"]  # both classes, tied and untied
