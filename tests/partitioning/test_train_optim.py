"""train-model's AdamW steps a large parameter in pieces (partitioning.train.optim.PiecewiseAdamW): bit for bit
torch.optim.AdamW, its state dict round trip included; its weight decay spares what HF Trainer's spares.

The acceptance tests' tiny models have no parameter as large as a piece, so the pieces are tested here: at
the runtime's own piece size (a 2.1-piece parameter) and at sizes that do not divide the parameter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import load_script
from support import REPO, SUPPORT
from support.release_process import environment
from support.threads import threads

from partitioning.train.optim import PIECE, OptimizerSettings, PiecewiseAdamW, make_optimizer

installer = load_script("install_releases")

OPTIONS: dict[str, Any] = {"lr": 0.01, "weight_decay": 0.01, "betas": (0.9, 0.99), "eps": 1e-8}


def run(optimizer_of, values: list[torch.Tensor], gradients: list[list[torch.Tensor]], resume_at: int | None = None
        ) -> list[torch.Tensor]:
    parameters = [torch.nn.Parameter(value.clone()) for value in values]
    optimizer = optimizer_of(parameters)
    for step, grads in enumerate(gradients):
        if step == resume_at:  # a new optimizer from the saved state dict, as --resume makes it
            state = optimizer.state_dict()
            optimizer = optimizer_of(parameters)
            optimizer.load_state_dict(state)
        for parameter, grad in zip(parameters, grads):
            parameter.grad = grad.clone()
        optimizer.step()
        optimizer.zero_grad()
        assert all(parameter.grad is None for parameter in parameters)
    return [parameter.detach() for parameter in parameters]


@pytest.mark.parametrize("numel,piece", [(2 * PIECE + PIECE // 10 + 3, PIECE), (10007, 1000), (10007, 333)])
def test_pieces_are_bit_equal_to_adamw(numel: int, piece: int) -> None:
    generator = torch.Generator().manual_seed(0)
    shapes = [(numel,), (7, 3), (piece + 1,)]
    values = [torch.randn(shape, generator=generator) for shape in shapes]
    gradients = [[torch.randn(shape, generator=generator) for shape in shapes] for _ in range(3)]
    with threads():
        expected = run(lambda ps: torch.optim.AdamW(ps, **OPTIONS), values, gradients)
        pieces = lambda ps: PiecewiseAdamW(ps, piece=piece, **OPTIONS)  # noqa: E731
        assert len(pieces([torch.nn.Parameter(v) for v in values]).param_groups[0]["params"]) > len(shapes)
        for resume_at in (None, 2):
            got = run(pieces, values, gradients, resume_at)
            assert all(torch.equal(a, b) for a, b in zip(got, expected)), resume_at


def test_a_state_saved_per_parameter_is_refused_in_one_line(tmp_path) -> None:
    """A resume state of the optimizer before pieces (one state per parameter) names the cause and the way on."""
    from common.errors import UserError
    from partitioning.train.save import restore, stage_file

    parameter = torch.nn.Parameter(torch.zeros(10))
    parameter.grad = torch.ones(10)
    old = torch.optim.AdamW([parameter], **OPTIONS)
    old.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(old, lambda step: 1.0)
    path = tmp_path / stage_file(0)
    path.parent.mkdir()
    torch.save({"names": ["w"], "optimizer": old.state_dict(), "scheduler": scheduler.state_dict(),
                "rng": {"cpu": torch.get_rng_state()}}, path)
    new = PiecewiseAdamW([parameter], piece=4, **OPTIONS)
    with pytest.raises(UserError, match=r"AdamW state for 1 tensors where this train-model steps 3: .*--checkpoint"):
        restore(tmp_path, 0, new, scheduler, ["w"], [parameter])
    restore(tmp_path, 0, torch.optim.AdamW([parameter], **OPTIONS), scheduler, ["w"], [parameter])  # same layout


def test_weight_decay_spares_what_hf_trainer_spares(tmp_path: Path) -> None:
    """Every family's default class at the newest release: train-model's no-decay group (and the training tests'
    one-process reference) holds exactly what that release's Trainer leaves out of weight decay."""
    release = installer.verified_releases()[-1]
    install = installer.install_dir(release)
    families = sorted(path.parent.name for path in (REPO / "generated_models").glob(f"*/v{release.replace('.', '_')}"))
    assert len(families) >= 10, families
    done = subprocess.run([sys.executable, str(SUPPORT / "decay_worker.py"), "--release", release, "--install-dir",
                           str(install), "--families", ",".join(families)], env=environment(install),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert sorted(found) == families
    for family, rules in found.items():
        assert rules["trainer"], family  # every family has biases or norm weights: the rule can be seen to fail
        assert rules["ours"] == rules["trainer"] == rules["reference"], (family, rules)


def test_the_no_decay_group_is_a_group_of_its_own() -> None:
    """make_optimizer: the exempt parameters in a weight-decay-0 group after the others'; decay_all keeps one group
    (and an empty group stays, so that a save fits every stage of its plan)."""
    named = [("a.weight", torch.nn.Parameter(torch.ones(2))), ("a.bias", torch.nn.Parameter(torch.ones(2)))]
    settings = OptimizerSettings(lr=0.1, weight_decay=0.5)
    optimizer, _ = make_optimizer(named, {"a.bias"}, settings)
    assert [(len(g["params"]), g["weight_decay"]) for g in optimizer.param_groups] == [(1, 0.5), (1, 0.0)]
    optimizer, _ = make_optimizer(named[:1], {"a.bias"}, settings)
    assert [(len(g["params"]), g["weight_decay"]) for g in optimizer.param_groups] == [(1, 0.5), (0, 0.0)]
    optimizer, _ = make_optimizer(named, {"a.bias"}, OptimizerSettings(lr=0.1, weight_decay=0.5, decay_all=True))
    assert [(len(g["params"]), g["weight_decay"]) for g in optimizer.param_groups] == [(2, 0.5)]
    for parameter in (p for _, p in named):
        parameter.grad = torch.zeros(2)
    optimizer, _ = make_optimizer(named, {"a.bias"}, settings)
    optimizer.step()  # zero gradients: only the decay moves a weight
    assert torch.equal(named[0][1], torch.full((2,), 0.95)) and torch.equal(named[1][1], torch.ones(2))
