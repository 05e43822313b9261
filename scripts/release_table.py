"""Rebuild issue 11's table: per transformers release, does T5 convert, equal stock, trace with fx and export?

Usage: python scripts/release_table.py [--releases 4.5.1,4.46.3] [--committed-only] [--json OUT]

For every release of scripts/transformers_releases.txt (installed side by side by scripts/setup.sh):
- converts: a committed package (generated_models/t5/v<release>/) must pass
  ``convert-model t5 --version X --source-dir .venv/transformers/X --check``; an uncommitted release is
  converted into a scratch directory from the same install ("yes, not committed" or the error line);
- the other columns run tests/t5_release_worker.py on that output in a process importing exactly that
  release (PYTHONPATH=.venv/transformers/<release>): eval/train/grads = eval, train, stateless-eval,
  stateless-train, state-dict and dropout-active; fx = symbolic_trace; export = strict and non-strict.
A cell is "yes" or "**no**" with the first failure. Markdown goes to stdout, one progress line per release
to stderr. Exit 0 when every row is all "yes", 1 otherwise, 2 on bad arguments or a missing install.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "scripts"))

from install_releases import install_dir, is_installed, read_releases  # noqa: E402
from t5_release_worker import CHECKS, run_in_subprocess  # noqa: E402

from converter.pipeline import version_dir  # noqa: E402

GENERATED = REPO / "generated_models"
COLUMNS = {
    "eval/train/grads equal to stock": ("eval", "train", "dropout-active", "state-dict", "stateless-eval",
                                        "stateless-train"),
    "fx": ("fx",),
    "export": ("export-strict", "export-non-strict"),
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
                           "--output-dir", str(scratch), "-q"], capture_output=True, text=True, cwd=REPO)
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

    rows, records = [], {}
    with tempfile.TemporaryDirectory(prefix="release-table-") as tmp:
        for release in chosen:
            cells, records[release] = row(release, Path(tmp) / release)
            rows.append(cells)
    header = ["release", "converts", *COLUMNS]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n", encoding="utf-8")
    return 0 if all(c == "yes" for cells in rows for c in cells[1:]) else 1


if __name__ == "__main__":
    sys.exit(main())
