"""Rebuild issue 11's table: per transformers release, does T5 convert, equal stock, trace with fx and export?

Usage: python scripts/release_table.py [--releases 4.5.1,4.46.3] [--committed-only] [--jobs N] [--json OUT] [--readme]

For every release the recipes verify (installed side by side by scripts/setup.sh, scripts/install_releases.py):
- converts: a committed package (generated_models/t5/v<release>/) must pass
  ``convert-model t5 --version X --source-dir .venv/transformers/X --check``; an uncommitted release is
  converted into a scratch directory from the same install ("yes, not committed" or the error line);
- the other columns run tests/t5_release_worker.py on that output in a process importing exactly that
  release (PYTHONPATH=.venv/transformers/<release>): eval/train/grads = eval, train, stateless-eval,
  stateless-train, state-dict and dropout-active; fx = symbolic_trace; export = strict and non-strict;
  partition-model = a 2-stage plan of every class of the committed package.
A cell is "yes" or "**no**" with the first failure. Markdown goes to stdout, one progress line per release
to stderr; --readme also writes the table into docs/t5_releases.md between its release-table markers. Exit 0
when every row is all "yes", 1 otherwise, 2 on bad arguments or a missing install.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))

from install_releases import install_dir, is_installed, read_releases  # noqa: E402
from t5_release_worker import CHECKS, run_in_subprocess  # noqa: E402

from common.atomic import write_atomic  # noqa: E402
from families.layout import version_dir  # noqa: E402

GENERATED = REPO / "generated_models"
TABLE_PAGE = REPO / "docs" / "t5_releases.md"  # where --readme writes the table
MARKERS = ("<!-- release-table: scripts/release_table.py --readme -->\n", "<!-- /release-table -->\n")
COLUMNS = {
    "eval/train/grads equal to stock": ("eval", "train", "dropout-active", "state-dict", "stateless-eval",
                                        "stateless-train"),
    "fx": ("fx",),
    "export": ("export-strict", "export-non-strict"),
    "partition-model": ("partition",),
}
assert sorted(c for checks in COLUMNS.values() for c in checks) == sorted(CHECKS)


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "no output").replace("|", "\\|")[:300]


def convert(release: str, scratch: Path) -> tuple[str, Path | None]:
    """The converts cell and the generated modeling file to check (None when there is none)."""
    committed = GENERATED / "t5" / version_dir(release) / "modeling_t5.py"
    source = ["--source-dir", str(install_dir(release))]
    if committed.is_file():
        proc = subprocess.run([sys.executable, "-m", "converter.cli", "t5", "--version", release, *source, "--check",
                               "-q"], capture_output=True, text=True, cwd=REPO)
        if proc.returncode == 0:
            return "yes", committed
        what = "out of date (`--check` found drift)" if proc.returncode == 1 else _one_line(proc.stderr)
        return f"**no**: committed package {what}", committed
    proc = subprocess.run([sys.executable, "-m", "converter.cli", "t5", "--version", release, *source,
                           "--output-dir", str(scratch), "--no-verify", "-q"], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        return f"**no**: `{_one_line(proc.stderr).removeprefix('convert-model: error: ')}`", None
    return "yes (not committed)", scratch / "t5" / version_dir(release) / "modeling_t5.py"


def cell(record: dict | None, checks: tuple[str, ...], stderr: str) -> str:
    if record is None:
        return f"**no**: worker failed: {_one_line(stderr)}"
    failing = [(name, record["checks"][name]) for name in checks if not record["checks"][name]["ok"]]
    if not failing:
        return "yes"
    name, result = failing[0]
    case, message = next(iter(result["failures"].items()), ("", "no case ran"))
    more = sum(len(r["failures"]) for _, r in failing) - 1
    return f"**no**: {name} {case}: {message}".replace("|", "\\|")[:300] + (f" (+{more} more)" if more > 0 else "")


def row(release: str, scratch: Path) -> tuple[list[str], dict | None]:
    started = time.monotonic()
    scratch.mkdir(parents=True)
    converts, generated = convert(release, scratch)
    if generated is None:
        return [release, converts] + ["-"] * len(COLUMNS), None
    _, record, stderr = run_in_subprocess(release, install_dir(release), generated, scratch / f"{release}.json")
    cells = [cell(record, checks, stderr) for checks in COLUMNS.values()]
    print(f"release-table: transformers {release}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    return [release, converts, *cells], record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release_table.py", description=__doc__.splitlines()[0])
    parser.add_argument("--releases", help="comma-separated subset of the listed releases")
    parser.add_argument("--committed-only", action="store_true", help="only releases with a committed package")
    parser.add_argument("--json", type=Path, help="also write the worker results here")
    parser.add_argument("--jobs", type=int, default=2, help="releases checked at once (default 2)")
    parser.add_argument("--readme", action="store_true", help="also write the table into docs/t5_releases.md")
    args = parser.parse_args(argv)
    listed = {release.version: release for release in read_releases()}
    chosen = args.releases.split(",") if args.releases else list(listed)
    unknown = [release for release in chosen if release not in listed]
    if unknown:
        print(f"release-table: error: not in the release list: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if args.committed_only:
        chosen = [r for r in chosen if (GENERATED / "t5" / version_dir(r) / "modeling_t5.py").is_file()]
    missing = [release for release in chosen if not is_installed(listed[release])]
    if missing:
        print(f"release-table: error: transformers {', '.join(missing)} not installed: run bash scripts/setup.sh",
              file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="release-table-") as tmp:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:  # each row runs in subprocesses of its own
            results = list(pool.map(lambda release: row(release, Path(tmp) / release), chosen))
    rows = [cells for cells, _ in results]
    records = {release: record for release, (_, record) in zip(chosen, results)}
    header = ["release", "converts", *COLUMNS]
    table = "| " + " | ".join(header) + " |\n" + "|" + "---|" * len(header) + "\n"
    table += "".join("| " + " | ".join(cells) + " |\n" for cells in rows)
    sys.stdout.write(table)
    if args.readme:
        text = TABLE_PAGE.read_text(encoding="utf-8")
        start, end = text.find(MARKERS[0]), text.find(MARKERS[1])
        if start < 0 or end < start:
            print(f"release-table: error: {TABLE_PAGE.relative_to(REPO)} has no {MARKERS[0].strip()} ... "
                  f"{MARKERS[1].strip()} markers", file=sys.stderr)
            return 2
        write_atomic(TABLE_PAGE, (text[:start + len(MARKERS[0])] + table + text[end:]).encode("utf-8"))
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
    return 0 if all(c == "yes" for cells in rows for c in cells[1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
