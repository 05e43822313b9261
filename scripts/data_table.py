"""Rebuild docs/train-model.md's table of the data each class trains on, from the recipes.

Usage: python scripts/data_table.py [--check] [--page PATH]

For every family at the transformers release this environment imports (run it with the venv's own, the newest
verified release: scripts/setup.sh), every class that trains (its forward returns the loss): the JSON Lines
fields train-model requires (the recipe's drawn inputs, token ids and labels, that the class's forward takes)
and those it fills in when a line has none (the masks). A label field of one integer per example (a sequence
classifier's, BERT's next-sentence label) says so. Writes the table between the page's data-table markers;
``--check`` writes nothing and exits 1 when the page's table differs (tests/docs/test_data_table.py runs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script: the repository's packages, not an install's

from common.atomic import write_atomic  # noqa: E402
from common.cli import Parser, nonempty_path, run  # noqa: E402
from common.errors import UserError  # noqa: E402
from families import installed  # noqa: E402
from families.definition import InputSpec  # noqa: E402
from families.family import ModelFamily  # noqa: E402
from families.registry import definitions  # noqa: E402

PAGE = REPO / "docs" / "train-model.md"
MARKERS = ("<!-- data-table: scripts/data_table.py -->\n", "<!-- /data-table -->\n")


def _field(spec: InputSpec) -> str:
    one = spec.shape == ("batch",)  # no sequence axis: one value per example
    return f"`{spec.name}`" + (" (an integer)" if one else "")


def table(release: str) -> str:
    """The markdown table of every family's training classes at ``release``."""
    lines = [f"| family | class (at {release}) | required | filled in when absent |", "| --- | --- | --- | --- |"]
    for name in sorted(definitions()):
        family = ModelFamily.load(name, release)
        for class_name in family.training_classes():
            specs = family.input_specs(class_name)
            required = [_field(spec) for spec in specs if spec.fill == "randint"]
            filled = [_field(spec) for spec in specs if spec.fill != "randint"]
            lines.append(f"| {name} | `{class_name}` | {', '.join(required)} | {', '.join(filled) or '-'} |")
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(prog="data_table.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the page's table differs")
    parser.add_argument("--page", type=nonempty_path, default=PAGE, help="the page (default docs/train-model.md)")
    return parser.parse_args(argv)


def execute(args: argparse.Namespace) -> int:
    release, where = installed.release("transformers")
    if release is None:
        raise UserError(f"no transformers imports here ({where}): run with the venv's Python (scripts/setup.sh)")
    text = args.page.read_text(encoding="utf-8")
    start, end = text.find(MARKERS[0]), text.find(MARKERS[1])
    if start < 0 or end < start:
        raise UserError(f"{args.page} has no data-table markers ({MARKERS[0].strip()} ... {MARKERS[1].strip()})")
    wanted = text[:start + len(MARKERS[0])] + table(release) + text[end:]
    if wanted == text:
        return 0
    if args.check:
        print(f"{args.page}: the data table differs from the recipes at transformers {release}: run "
              f"python scripts/data_table.py", file=sys.stderr)
        return 1
    write_atomic(args.page, wanted.encode("utf-8"))
    print(f"wrote the data table of transformers {release} into {args.page}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run("data_table.py", parse, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
