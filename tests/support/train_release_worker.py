"""train-model against one process for every family of one transformers release, in a process of its own.

Run with ``PYTHONPATH=.venv/transformers/<release>`` (release_process.environment; the test is
tests/releases/test_train_releases.py):

    python tests/support/train_release_worker.py --release 5.23.0 --install-dir .venv/transformers/5.23.0 \\
        --families t5,gpt2,llama --out DIR

Per family (support/train_runs.py CASES and LLM_CASES: its tiny config without dropout, its default class):
a stock checkpoint (save_pretrained), a 2-stage plan, a data file. The schedules alternate along the
families, and the other way round at every other release, so that every release runs both. All families'
train-model runs (3 AdamW steps, warm-up, clipping, weight decay) are one torchrun launch of 2 gloo ranks;
then each saved directory is loaded with stock from_pretrained and compared with the same steps in this
process. DIR/result.json: family -> schedule, the stage-only check, and every tensor that is not
torch.equal (its largest difference). Exit 0 when all are equal, 1 when one is not, 2 when the
environment is wrong.
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


def schedule_of(position: int, release: str) -> str:
    """GPipe and 1F1B alternating along the families; at every other release (by its minor) the other way."""
    flip = int(release.split(".")[1]) % 2
    return ("gpipe", "1f1b")[(position + flip) % 2]


def run(release: str, names: list[str], out: Path, reference_lr: float) -> dict[str, dict]:
    from support.train_runs import (
        CASES,
        LLM_CASES,
        OPTIONS,
        STEPS,
        assert_stage_only,
        launch,
        reference,
        save_checkpoint,
        saved_differences,
        write_data,
        write_plan,
    )

    cases, prepared = {}, {}
    for position, name in enumerate(names):
        family, root = family_at(name, release), out / name
        config_name, splits = {**CASES, **LLM_CASES}[name]
        schedule = schedule_of(position, release)
        checkpoint, plan, data = root / "checkpoint", root / "plan.json", root / "data.jsonl"
        cfg = save_checkpoint(family, config_name, checkpoint)
        write_plan(family, cfg, dict(splits)[schedule], schedule, plan)
        write_data(data, plan)
        cases[name] = ["--plan", str(plan), "--checkpoint", str(checkpoint), "--data", str(data), "--steps",
                       str(STEPS), "--save", str(root / "out"), *OPTIONS]
        prepared[name] = (family, schedule, checkpoint, plan, data)
    import resource, time
    def cpu(tag):
        a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        print(tag, round(a.ru_utime + a.ru_stime, 1), round(b.ru_utime + b.ru_stime, 1), round(time.time()), file=sys.stderr)
    cpu("prepared")
    records = launch(2, cases, out / "records")
    cpu("launched")
    results = {}
    for name, (family, schedule, checkpoint, plan, data) in prepared.items():
        assert_stage_only(records[name])
        expected = reference(family, checkpoint, plan, data, STEPS, lr=reference_lr)
        results[name] = {"schedule": schedule, "different": saved_differences(family, out / name / "out", expected)}
    cpu("compared")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--install-dir", required=True, type=Path)
    parser.add_argument("--families", required=True, help="comma-separated, every family committed at the release")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--reference-lr", type=float, default=None,
                        help="the one-process reference's learning rate (default the ranks'): shows the check fails")
    args = parser.parse_args()
    wrong = wrong_release(args.release, args.install_dir)
    if wrong:
        print(wrong, file=sys.stderr)
        return 2
    import torch

    from support.train_runs import LR

    torch.set_num_threads(1)
    results = run(args.release, args.families.split(","), args.out, args.reference_lr or LR)
    (args.out / "result.json").write_text(json.dumps(results, indent=1))
    return 0 if all(not result["different"] for result in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
