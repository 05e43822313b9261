"""The IPU target starts from train-model's --checkpoint: the model its parallelize() places, with those weights.

A stock GPT-2 (transformers 4.5.1, tiny, tied head) is saved with save_pretrained; partition-model --target ipu
plans it from that config.json and writes the parallelize() module; load_placed_model builds the plan's
model, loads the directory and calls parallelize() (poptorch: tests/support/poptorch_standin.py).  Every
weight is torch.equal to stock from_pretrained's, the forward gives stock's loss bit for bit, and under the
stand-in's IPU tracing the blocks start where the generated code says.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support import poptorch_standin
from support.model_families import FAMILIES
from transformers.models.gpt2 import modeling_gpt2 as stock

from common.errors import UserError
from partitioning.cli import main as partition_model
from partitioning.files import read_plan
from partitioning.ipu.checkpoint import load_model, load_placed_model
from partitioning.ipu.errors import IPUError
from stateless.torch_internals import forward_pre_hooks


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "poptorch", poptorch_standin)  # the stand-in, not Graphcore's poptorch
    return poptorch_standin


@pytest.fixture(scope="module")
def placed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved stock checkpoint and, per form, the plan and parallelize() module partition-model made from it."""
    root = tmp_path_factory.mktemp("ipu_checkpoint")
    torch.manual_seed(0)
    stock.GPT2LMHeadModel(FAMILIES["gpt2"].make_config("3layer-tied-relu-inner")).save_pretrained(root / "checkpoint")
    for form in ("stateless", "stateful"):
        assert partition_model(["gpt2", "--version", "4.5.1", "--config", str(root / "checkpoint" / "config.json"),
                                "--seq-len", "sequence=8", "--target", "ipu", "--ipus", "2", "--ipu-form", form, "--output",
                                str(root / f"{form}.plan.json"), "--ipu-code", str(root / f"{form}.py"),
                                "--ipu-options", str(root / f"{form}.conf")]) == 0
    return root


def batch(config) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    return {"input_ids": ids, "labels": ids}


@pytest.mark.parametrize("form", ["stateless", "stateful"])
def test_the_placed_model_holds_the_checkpoint(standin, placed: Path, form: str) -> None:
    code = placed / f"{form}.py"
    model: Any = load_placed_model(read_plan(placed / f"{form}.plan.json"), placed / "checkpoint", code, form)
    expected = stock.GPT2LMHeadModel.from_pretrained(placed / "checkpoint").eval()
    got, want = model.stateful_state_dict(), expected.state_dict()
    assert sorted(got) == sorted(want)
    assert [key for key in want if not torch.equal(got[key], want[key])] == []
    hooks = [h for m in model.modules() for h in forward_pre_hooks(m).values() if type(h).__name__ == "_BlockHook"]
    assert len(hooks) == code.read_text().count("poptorch.BeginBlock(") > 0
    inputs = batch(expected.config)
    with torch.no_grad(), standin.ipu_tracing() as tracer:
        loss = model.eval()(**inputs)
    assert torch.equal(loss, expected(**inputs).loss)
    assert [ipu for _, ipu in tracer.starts] and {ipu for _, ipu in tracer.starts} == {0, 1}


def test_the_wrong_form_names_the_fix(standin, placed: Path) -> None:
    plan = read_plan(placed / "stateless.plan.json")
    with pytest.raises(UserError, match="this placement is for the stateless form: call model.make_stateless"):
        load_placed_model(plan, placed / "checkpoint", placed / "stateless.py", "stateful")


def test_without_poptorch_nothing_is_loaded(monkeypatch: pytest.MonkeyPatch, placed: Path) -> None:
    monkeypatch.setitem(sys.modules, "poptorch", None)  # import poptorch raises ImportError
    with pytest.raises(IPUError, match="poptorch is required"):
        load_placed_model(read_plan(placed / "stateless.plan.json"), placed / "checkpoint", placed / "stateless.py")


def test_a_checkpoint_of_another_model_is_refused(placed: Path, tmp_path: Path) -> None:
    other = FAMILIES["gpt2"].make_config("3layer-tied-relu-inner")
    other.n_layer = 2
    stock.GPT2LMHeadModel(other).save_pretrained(tmp_path / "other")
    with pytest.raises(UserError, match="has n_layer = 2, the plan 3"):
        load_model(read_plan(placed / "stateless.plan.json"), tmp_path / "other")
