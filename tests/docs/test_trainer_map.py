"""docs/train-model.md, "Coming from HF Trainer": every row names a field the newest verified release's
``TrainingArguments`` has and a flag train-model (or partition-model) has, and each "same default" is the value
both have, so the map cannot drift from either side."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

from conftest import load_script
from support import REPO
from support.release_process import environment

from partitioning import cli as partition_cli
from partitioning.train.request import parser as train_parser

installer = load_script("install_releases")
PAGE = REPO / "docs" / "train-model.md"
# Trainer's fields whose one value is two of ours, or the other way round
JOINED = {("adam_beta1", "adam_beta2"): "betas"}
_FIELDS = """
import dataclasses, json
from transformers import TrainingArguments
print(json.dumps({f.name: f.default for f in dataclasses.fields(TrainingArguments)
                  if f.default is not dataclasses.MISSING and isinstance(f.default, (int, float, str, type(None)))}
                 | {f.name: None for f in dataclasses.fields(TrainingArguments) if f.default is dataclasses.MISSING}))
"""


def rows() -> list[tuple[list[str], str, str]]:
    """(Trainer's fields, our column, the note) of each row of the section's table."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("## Coming from HF Trainer", 1)[1].split("\n## ", 1)[0]
    found = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 3 or not cells[0].startswith("`") or cells[0] == "`TrainingArguments`":
            continue
        found.append((re.findall(r"`([a-z0-9_]+)`", cells[0]), cells[1], cells[2]))
    return found


def default(parser: argparse.ArgumentParser, name: str) -> object:
    """The default of ``parser``'s option ``name``, which its help must list."""
    assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", parser.format_help()), f"{parser.prog} has no {name}"
    return parser.get_default(name.removeprefix("--").replace("-", "_"))


def test_every_row_is_a_trainer_field_and_one_of_our_flags() -> None:
    release = installer.verified_releases()[-1]
    install = installer.install_dir(release)
    done = subprocess.run([sys.executable, "-c", _FIELDS], env=environment(install), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    trainer = json.loads(done.stdout.splitlines()[-1])
    table = rows()
    assert len(table) >= 20, table  # the section's table was found
    same = 0
    for names, ours, note in table:
        for name in names:
            assert name in trainer, f"TrainingArguments of {release} has no field {name}"
        flags = re.findall(r"--[a-z-]+", ours)
        if not flags:
            assert ours.startswith("(") and note, (names, ours)  # not a flag: said how it stands
            continue
        parser = partition_cli._parser() if ours.startswith("`partition-model") else train_parser()
        ours_default = default(parser, flags[0])
        if note.startswith("same default"):
            same += 1
            theirs = tuple(trainer[name] for name in names) if tuple(names) in JOINED else trainer[names[0]]
            assert ours_default == theirs, (names, ours_default, theirs)
            assert f"({', '.join(map(str, theirs)) if isinstance(theirs, tuple) else theirs})" in note, note
    assert same >= 5, table
