"""HF Trainer's weight-decay rule against train-model's, on every family's default class at one release.

Run with ``PYTHONPATH=.venv/transformers/<release>`` (release_process.environment; the test is
tests/partitioning/test_train_optim.py):

    python tests/support/decay_worker.py --release 5.25.0 --install-dir .venv/transformers/5.25.0 \\
        --families t5,gpt2,llama

Prints one JSON object: family -> the stock names of the parameters each rule gives no weight decay:
``trainer`` (the release's own ``Trainer.get_decay_parameter_names``), ``ours``
(partitioning.train.optim.exempt_from_decay, every name its own stock name) and ``reference`` (the one-process
reference of the training tests, support/train_runs.trainer_groups).  Exit 2 when the environment is wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Run as a script: tests/ for the support package, this checkout before any editable install of another one.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]

from partitioning.train.optim import exempt_from_decay  # noqa: E402
from support.release_process import wrong_release  # noqa: E402
from support.train_release_worker import family_at  # noqa: E402
from support.train_runs import RELEASE_CASES, stock_class, trainer_groups, without_dropout  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True)
    parser.add_argument("--install-dir", type=Path, required=True)
    parser.add_argument("--families", required=True, help="comma-separated")
    args = parser.parse_args(argv)
    problem = wrong_release(args.release, args.install_dir)
    if problem:
        print(f"decay-worker: {problem}", file=sys.stderr)
        return 2
    from transformers import Trainer

    found = {}
    for name in args.families.split(","):
        family = family_at(name, args.release)
        model = stock_class(family)(without_dropout(family.make_config(RELEASE_CASES[name][0])))
        everything = {parameter for parameter, _ in model.named_parameters()}
        reference = {id(p) for p in trainer_groups(model, 0.01)[1]["params"]}
        found[name] = {
            # the method reads nothing of the trainer itself
            "trainer": sorted(everything - set(Trainer.get_decay_parameter_names(None, model))),
            "ours": sorted(exempt_from_decay(model, str)),  # the stock model: each name its own stock name
            "reference": sorted(parameter for parameter, p in model.named_parameters() if id(p) in reference)}
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
