"""The README's quickstart, run as written: the two commands at its very top and the bash block under
"## Quickstart", extracted from README.md, so they cannot go stale.

They run in the default environment (no PYTHONPATH: the venv's own transformers), in a directory that mirrors
the checkout (every top-level entry a link to it), so the files they write (plan.json, cal.json, out/...) land
in the scratch directory; bash scripts/setup.sh is idempotent and returns at once when set up.  The user's own
files the last two commands name (my-t5/, train.jsonl) are made first: a tiny T5 saved by the installed
release's stock ``save_pretrained``, and examples of its vocabulary.  The top's second command runs this very
suite, so it is checked to be that command and not run from inside it.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
from pathlib import Path

from conftest import REPO
from support.suite_release import user_environment

SUITE = "bash scripts/setup.sh && .venv/bin/python -m pytest -n 2"
SAVE = """
import sys, torch, transformers
torch.manual_seed(0)
config = transformers.T5Config(vocab_size=64, d_model=16, d_ff=32, d_kv=8, num_layers=2, num_heads=2,
                               dropout_rate=0.0, decoder_start_token_id=0)
transformers.T5ForConditionalGeneration(config).save_pretrained(sys.argv[1])
"""


def commands(block: str) -> list[str]:
    """The command lines of a bash block, continuation lines joined as bash joins them."""
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def quickstart(readme: str) -> tuple[list[str], list[str]]:
    """The README's first bash block, and the one under "## Quickstart"."""
    top = re.match(r"```bash\n(.*?)```\n", readme, re.DOTALL)
    section = re.search(r"^## Quickstart[^\n]*\n+```bash\n(.*?)```\n", readme, re.DOTALL | re.MULTILINE)
    assert top and section, "README.md no longer opens with a bash block, or has no bash block under ## Quickstart"
    return commands(top.group(1)), commands(section.group(1))


def test_the_blocks_are_found_and_continued_lines_joined() -> None:
    top, section = quickstart("```bash\na && b   # x\n```\n\n## Quickstart: go\n\n```bash\nc --d \\\n    e  # y\nf\n```\n")
    assert (top, section) == (["a && b   # x"], ["c --d      e  # y", "f"])


def write_user_files(work: Path, env: dict[str, str]) -> None:
    subprocess.run([str(work / ".venv" / "bin" / "python"), "-c", SAVE, "my-t5"], cwd=work, env=env, check=True,
                   capture_output=True)
    rng = random.Random(0)
    with (work / "train.jsonl").open("w") as out:
        for _ in range(64):  # a step: 2 replicas x 8 micro-batches x 2 examples
            length = rng.randint(2, 6)
            out.write(json.dumps({"input_ids": [rng.randrange(1, 64) for _ in range(6)],
                                  "decoder_input_ids": [0] + [rng.randrange(1, 64) for _ in range(length - 1)],
                                  "labels": [rng.randrange(1, 64) for _ in range(length)]}) + "\n")


def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    top, section = quickstart((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(top) == 2 and top[1].split("#")[0].strip() == SUITE, top
    work = tmp_path / "checkout"
    work.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in (".git",):
            (work / entry.name).symlink_to(entry)
    env = {**user_environment(), "OMP_NUM_THREADS": "1"}
    subprocess.run(["bash", "scripts/setup.sh"], cwd=work, env=env, check=True, capture_output=True)
    write_user_files(work, env)
    for command in [top[0], *section]:
        done = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                              timeout=900, stdin=subprocess.DEVNULL)
        assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert json.loads((work / "my-plan.json").read_text())["model"]["config"]["d_model"] == 16
    assert (work / "out" / "config.json").is_file() and (work / "timeline.json").is_file()
