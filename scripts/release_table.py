"""Rebuild the release table: per family and transformers release, does it convert, equal stock, trace, plan?

Usage: python scripts/release_table.py [--families t5,gpt2] [--releases 4.5.1,4.46.3] [--jobs N] [--json OUT]
                                       [--readme]

Rows: every committed package (generated_models/<family>/v<release>/) of the chosen families and releases, each
release taken from its side-by-side install (scripts/setup.sh, scripts/install_releases.py):
- converts: ``convert-model FAMILY --version X --source-dir .venv/transformers/X --check``;
- the other columns run the family's release worker on the committed package, in a process importing exactly
  that release (PYTHONPATH=.venv/transformers/<release>), one process per release and worker for all families
  at it: tests/support/t5_release_worker.py (T5), seed_release_worker.py (GPT-2, BERT, RoBERTa, BART),
  llm_release_worker.py (Llama, Qwen2, Qwen3, Mistral, Gemma 3). eval/train/grads = eval, same-seed train loss
  and every gradient, state-dict keys, the stateless form; fx = symbolic_trace (and the train-mode graph);
  export = strict and non-strict with dynamic sizes; partition-model = a 2-stage plan (T5: of every class).
A cell is "yes" or "**no**" with the first failure. Markdown goes to stdout (the full table), one progress line
per worker run to stderr; --readme also writes the full table into docs/releases.md and the compact one (a
family x release matrix) into README.md, each between its release-table markers (rows not run this time are
kept as the page has them, so one release or family can be refreshed alone). Exit 0 when every cell is
"yes", 1 otherwise, 2 on bad arguments or a missing install.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))

import support.llm_release_worker as llm_worker  # noqa: E402
import support.seed_release_worker as seed_worker  # noqa: E402
import support.t5_release_worker as t5_worker  # noqa: E402
from install_releases import install_dir, is_installed, read_releases  # noqa: E402
from support.llm_models import FAMILIES as LLM_FAMILIES  # noqa: E402
from support.seed_releases import FAMILIES as SEED_FAMILIES  # noqa: E402

from common.atomic import write_atomic  # noqa: E402
from common.versions import Release  # noqa: E402
from families.layout import version_dir  # noqa: E402

GENERATED = REPO / "generated_models"
FAMILIES = ("t5", *SEED_FAMILIES, *LLM_FAMILIES)
PAGES = {REPO / "docs" / "releases.md": "full", REPO / "README.md": "compact"}  # --readme writes these
MARKERS = ("<!-- release-table: scripts/release_table.py --readme -->\n", "<!-- /release-table -->\n")
COLUMNS = {  # column -> the worker checks it sums up (a worker lacking one simply has no such check)
    "eval/train/grads equal to stock": ("eval", "train", "dropout-active", "state-dict", "stateless",
                                        "stateless-eval", "stateless-train"),
    "fx": ("fx", "train-graph"),
    "export": ("export-strict", "export-non-strict"),
    "partition-model": ("partition",),
}
Checks = dict[str, dict]  # check -> {"ok": bool, "failures": {case: message}}


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no output").replace("|", "\\|")[:300]


def committed(families: list[str], releases: list[str] | None) -> dict[str, list[str]]:
    """release -> the chosen families committed for it, releases in version order."""
    found: dict[str, list[str]] = {}
    for family in families:
        for package in sorted((GENERATED / family).glob("v*/")):
            release = package.name[1:].replace("_", ".")
            if releases is None or release in releases:
                found.setdefault(release, []).append(family)
    return dict(sorted(found.items(), key=lambda item: Release.parse(item[0])))


def converts(family: str, release: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "converter.cli", family, "--version", release, "--source-dir",
                           str(install_dir(release)), "--check", "-q"], capture_output=True, text=True, cwd=REPO)
    if proc.returncode == 0:
        return "yes"
    return "**no**: " + ("out of date (`--check` found drift)" if proc.returncode == 1 else _one_line(proc.stderr))


def plans(family: str, release: str) -> Checks:
    """A 2-stage plan of the family's default class on the committed package of ``release``."""
    env = {**os.environ, "PYTHONPATH": str(install_dir(release)), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="release-table-plan-") as scratch:  # the plan is not kept
        proc = subprocess.run([sys.executable, "-m", "partitioning.cli", family, "--version", release, "--stages", "2",
                               "--output", str(Path(scratch) / "plan.json")], capture_output=True, text=True, cwd=REPO,
                              env=env)
    failures = {} if proc.returncode == 0 else {"2 stages": _one_line(proc.stderr or proc.stdout)}
    return {"partition": {"ok": not failures, "failures": failures}}


def run_worker(kind: str, release: str, families: list[str], scratch: Path) -> dict[str, Checks | str]:
    """family -> its checks, or the reason the worker gave none."""
    started = time.monotonic()
    try:
        results = _run_worker(kind, release, families, scratch / f"{kind}-{release}.json")
    except subprocess.TimeoutExpired as timeout:  # a worker past its limit: its cells fail, the table is still written
        results = {family: f"timed out after {timeout.timeout:.0f} s" for family in families}
    print(f"release-table: transformers {release} ({', '.join(families)}): {time.monotonic() - started:.0f} s",
          file=sys.stderr)
    return results


def _run_worker(kind: str, release: str, families: list[str], out: Path) -> dict[str, Checks | str]:
    if kind == "t5":
        package = GENERATED / "t5" / version_dir(release) / "modeling_t5.py"
        _, record, stderr = t5_worker.run_in_subprocess(release, install_dir(release), package, out)
        results: dict[str, Checks | str] = {"t5": record["checks"] if record else _one_line(stderr)}
    else:
        worker = seed_worker if kind == "seed" else llm_worker
        _, record, stderr = worker.run_in_subprocess(release, install_dir(release), families, out)
        results = {family: record["families"][family] if record else _one_line(stderr) for family in families}
        for family in families:
            if isinstance(results[family], dict):
                results[family] = {**results[family], **plans(family, release)}  # type: ignore[dict-item]
    return results


def cell(checks: Checks | str, names: tuple[str, ...]) -> str:
    if isinstance(checks, str):
        return f"**no**: worker failed: {checks}"
    present = [name for name in names if name in checks]
    if not present:
        return "-"
    failing = [(name, checks[name]) for name in present if not checks[name]["ok"]]
    if not failing:
        return "yes"
    name, result = failing[0]
    case, message = next(iter(result["failures"].items()), ("", "no case ran"))
    more = sum(len(r["failures"]) for _, r in failing) - 1
    return f"**no**: {name} {case}: {message}".replace("|", "\\|")[:300] + (f" (+{more} more)" if more > 0 else "")


def tables(rows: list[list[str]], releases: list[str], families: list[str]) -> dict[str, str]:
    """The full table (one row per family and release) and the compact one (a family x release matrix)."""
    header = ["family", "release", "converts", *COLUMNS]
    full = "| " + " | ".join(header) + " |\n" + "|" + "---|" * len(header) + "\n"
    full += "".join("| " + " | ".join(cells) + " |\n" for cells in rows)
    status = {(cells[0], cells[1]): all(c in ("yes", "-") for c in cells[2:]) for cells in rows}
    compact = "| family | " + " | ".join(releases) + " |\n" + "|---|" + "---|" * len(releases) + "\n"
    for family in families:
        marks = ["" if (family, r) not in status else "✓" if status[family, r] else "✗" for r in releases]
        compact += f"| {family} | " + " | ".join(marks) + " |\n"
    return {"full": full, "compact": compact}


def previous_rows() -> list[list[str]]:
    """The rows of the full table docs/releases.md holds now (none before its first run)."""
    page = next(page for page, which in PAGES.items() if which == "full")
    text = page.read_text(encoding="utf-8") if page.is_file() else ""
    start, end = text.find(MARKERS[0]), text.find(MARKERS[1])
    lines = text[start + len(MARKERS[0]):end].splitlines()[2:] if 0 <= start < end else []
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in lines if line.startswith("| ")]


def write_between_markers(page: Path, table: str) -> str | None:
    """The table written into ``page`` between its markers; the error line when it has none."""
    text = page.read_text(encoding="utf-8")
    start, end = text.find(MARKERS[0]), text.find(MARKERS[1])
    if start < 0 or end < start:
        return f"{page.relative_to(REPO)} has no {MARKERS[0].strip()} ... {MARKERS[1].strip()} markers"
    write_atomic(page, (text[:start + len(MARKERS[0])] + table + text[end:]).encode("utf-8"))
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release_table.py", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--families", help="comma-separated subset of: " + ", ".join(FAMILIES))
    parser.add_argument("--releases", help="comma-separated subset of the listed releases")
    parser.add_argument("--json", type=Path, help="also write the worker results here")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes at once (default 2)")
    parser.add_argument("--readme", action="store_true", help="also write the tables into docs/releases.md and "
                                                              "README.md")
    args = parser.parse_args(argv)
    families = args.families.split(",") if args.families else list(FAMILIES)
    listed = {release.version: release for release in read_releases()}
    chosen = args.releases.split(",") if args.releases else None
    unknown = [f for f in families if f not in FAMILIES] + [r for r in chosen or () if r not in listed]
    if unknown:
        print(f"release-table: error: unknown family or release: {', '.join(unknown)}", file=sys.stderr)
        return 2
    found = committed(families, chosen)
    missing = [release for release in found if release not in listed or not is_installed(listed[release])]
    if missing:
        print(f"release-table: error: transformers {', '.join(missing)} not installed: run bash scripts/setup.sh",
              file=sys.stderr)
        return 2
    kinds: dict[str, Callable[[str], bool]] = {"t5": lambda f: f == "t5", "seed": SEED_FAMILIES.__contains__,
                                               "llm": LLM_FAMILIES.__contains__}
    runs = [(kind, release, [f for f in members if test(f)]) for release, members in found.items()
            for kind, test in kinds.items() if any(test(f) for f in members)]
    with tempfile.TemporaryDirectory(prefix="release-table-") as tmp:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:  # each run is a subprocess of its own
            outcomes = list(pool.map(lambda run: run_worker(run[0], run[1], run[2], Path(tmp)), runs))
            converted = dict(zip([(f, r) for r, fs in found.items() for f in fs],
                                 pool.map(lambda fr: converts(*fr), [(f, r) for r, fs in found.items() for f in fs])))
    results = {(family, release): checks for (_, release, _), outcome in zip(runs, outcomes)
               for family, checks in outcome.items()}
    rows = [[family, release, converted[family, release],
             *(cell(results[family, release], names) for names in COLUMNS.values())]
            for family in families for release in found if (family, release) in results]
    sys.stdout.write(tables(rows, list(found), families)["full"])
    if args.readme:  # the rows run now replace theirs in the page's table; the others are kept
        kept = {(cells[0], cells[1]): cells for cells in previous_rows()}
        kept.update({(cells[0], cells[1]): cells for cells in rows})
        ordered = sorted(kept.values(), key=lambda c: (FAMILIES.index(c[0]), Release.parse(c[1])))
        releases = sorted({c[1] for c in ordered}, key=Release.parse)
        made = tables(ordered, releases, [f for f in FAMILIES if any(c[0] == f for c in ordered)])
        for page, which in PAGES.items():
            problem = write_between_markers(page, made[which])
            if problem:
                print(f"release-table: error: {problem}", file=sys.stderr)
                return 2
    if args.json:
        args.json.write_text(json.dumps({f"{f}@{r}": c for (f, r), c in results.items()}, indent=2) + "\n",
                             encoding="utf-8")
    return 0 if all(c in ("yes", "-") for cells in rows for c in cells[2:]) else 1


if __name__ == "__main__":
    sys.exit(main())
