"""train-model against one process for every family of one transformers release: one torchrun launch of 2 ranks.

Run with ``PYTHONPATH=.venv/transformers/<release>`` (release_process.environment; the test is
tests/releases/test_train_releases.py):

    torchrun --standalone --nproc-per-node=2 tests/support/train_release_worker.py --release 5.23.0 \\
        --install-dir .venv/transformers/5.23.0 --families t5,gpt2,llama --heads BertForMaskedLM --first gpipe \\
        --out DIR

Rank 0 writes, per family (support/train_runs.py RELEASE_CASES: its tiny config without dropout, its default
class) and per head class of ``--heads`` (HEAD_CASES: its family's config, its labels), a stock checkpoint
(save_pretrained), a 2-stage plan and a data file.  The schedules alternate along the families, then the heads,
starting with ``--first`` (the test alternates it along the releases), so that every release runs both.  Both ranks then run every family's train-model (3 AdamW steps, warm-up, clipping, weight decay;
support/train_worker.py's case), and rank r compares every other family from the r-th: the saved directory
loaded with stock from_pretrained against the same steps in one process.  The ranks import each family's
modules to train it anyway, so preparing and comparing here costs no process of its own.
DIR/result.rank<r>.json: family -> schedule and every tensor that is not torch.equal (its largest
difference).  Exit 0 when all are equal, 1 when one is not, 2 when the environment is wrong.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Run as a script: tests/ for the support package, this checkout before any editable install of another one.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]
from families.family import ModelFamily  # noqa: E402
from support.release_process import wrong_release  # noqa: E402
from support.t5_cases import TRAIN_SOURCE, TRAIN_TARGET, config_kwargs  # noqa: E402

SEED_FAMILIES = ("t5", "gpt2", "bert", "roberta", "bart")
SCHEDULES = ("gpipe", "1f1b")


@dataclass
class T5At:
    """T5 at this process's release, as support/train_runs.py reads a family (t5_models imports 4.5.1's package)."""

    release: str
    name: str = "t5"
    train_lengths: dict[str, int] = field(default_factory=lambda: {"source": TRAIN_SOURCE, "target": TRAIN_TARGET})

    def make_config(self, name: str) -> Any:
        import transformers

        return transformers.T5Config(**config_kwargs(name))

    @property
    def model_family(self) -> ModelFamily:
        return ModelFamily.load("t5", self.release)


def family_at(name: str, release: str) -> Any:
    """The family ``name`` at ``release`` (the release this process imports)."""
    if name == "t5":
        return T5At(release)
    if name in SEED_FAMILIES:
        return importlib.import_module(f"support.{name}_models").family_at(release)
    from support.llm_pipelining import LLM

    return LLM(name, release)


def case_family(name: str, release: str) -> Any:
    """A case's family at ``release``: a family by name, or a head class (support/train_runs.py HEAD_CASES) on its
    family, whose default class it becomes."""
    from support.heads import class_family
    from support.train_runs import HEAD_CASES

    if name in HEAD_CASES:
        return class_family(family_at(HEAD_CASES[name][0], release), name)
    return family_at(name, release)


def prepare(release: str, names: list[str], first: str, out: Path) -> dict[str, list[str]]:
    """Each family's (or head class's) checkpoint, plan and data under ``out/<name>``; its train-model command
    line.  A head takes its HEAD_CASES config and 2-stage split, the schedules alternating on from the families'."""
    from support.train_runs import HEAD_CASES, OPTIONS, RELEASE_CASES, STEPS, save_checkpoint, write_data, write_plan

    cases = {}
    for position, name in enumerate(names):
        family, root = case_family(name, release), out / name
        schedule = SCHEDULES[(SCHEDULES.index(first) + position) % 2]
        if name in HEAD_CASES:
            config_name, split = HEAD_CASES[name][1], HEAD_CASES[name][3]
        else:
            config_name, split = RELEASE_CASES[name][0], RELEASE_CASES[name][1][schedule]
        cfg = save_checkpoint(family, config_name, root / "checkpoint")
        write_plan(family, cfg, split, schedule, root / "plan.json")
        write_data(root / "data.jsonl", root / "plan.json")
        cases[name] = ["--plan", str(root / "plan.json"), "--checkpoint", str(root / "checkpoint"), "--data",
                       str(root / "data.jsonl"), "--steps", str(STEPS), "--save", str(root / "out"), *OPTIONS]
    (out / "cases.json").write_text(json.dumps(cases))
    return cases


def compare(release: str, name: str, out: Path, records: list[dict], reference_lr: float) -> dict:
    """The family's saved directory against the same steps in this process."""
    from partitioning.files import read_plan
    from partitioning.solve.partition import Settings
    from support.train_runs import STEPS, assert_stage_only, reference, saved_differences

    family, root = case_family(name, release), out / name
    assert_stage_only(records)
    expected = reference(family, root / "checkpoint", root / "plan.json", root / "data.jsonl", STEPS, lr=reference_lr)
    schedule = Settings.from_plan(read_plan(root / "plan.json").settings).schedule
    return {"schedule": schedule, "different": saved_differences(family, root / "out", expected)}


def run(args: argparse.Namespace) -> dict[str, dict]:
    """Rank 0 prepares; every rank trains every case; rank r compares the families r, r + 2, ..."""
    import torch.distributed as dist
    from train_worker import run_case

    from support.train_runs import LR

    rank = dist.get_rank()
    if rank == 0:
        prepare(args.release, args.families.split(",") + [h for h in args.heads.split(",") if h], args.first,
                args.out)
    dist.barrier()
    cases = json.loads((args.out / "cases.json").read_text())
    for name, argv in cases.items():
        run_case(name, argv, args.out)
    dist.barrier()  # every rank's records written
    ranks = range(dist.get_world_size())
    dist.destroy_process_group()  # 5.x's save_pretrained (in the comparison) writes nothing off rank 0 of a group
    return {name: compare(args.release, name, args.out,
                          [json.loads((args.out / f"{name}.rank{r}.json").read_text()) for r in ranks],
                          args.reference_lr or LR)
            for name in list(cases)[rank::len(ranks)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--install-dir", required=True, type=Path)
    parser.add_argument("--families", required=True, help="comma-separated, every family committed at the release")
    parser.add_argument("--heads", default="", help="comma-separated head classes (train_runs.HEAD_CASES) to run too")
    parser.add_argument("--first", choices=SCHEDULES, default=SCHEDULES[0], help="the first family's schedule")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--reference-lr", type=float, default=None,
                        help="the one-process reference's learning rate (default the ranks'): shows the check fails")
    args = parser.parse_args()
    wrong = wrong_release(args.release, args.install_dir)
    if wrong:
        print(wrong, file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        results = run(args)
        (args.out / f"result.rank{rank}.json").write_text(json.dumps(results, indent=1))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0 if all(not result["different"] for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
