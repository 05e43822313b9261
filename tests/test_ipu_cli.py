"""run_ipu: what ``partition-model t5 --version 4.5.1 --target ipu --ipus 4`` does once it has a plan."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import poptorch_standin
import pytest
from test_ipu_t5 import t5, t5_plan

from partitioning.ipu.cli import add_ipu_arguments, run_ipu


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "poptorch", poptorch_standin)  # the stand-in, not Graphcore's poptorch
    return poptorch_standin


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="partition-model")
    parser.add_argument("family")
    add_ipu_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(t5_plan(t5("stateless"), 4, "stateless").to_json())
    return path


def test_prints_the_placement_and_writes_code_and_options(standin, tmp_path: Path, plan_file: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, options = tmp_path / "out" / "ipu_parallelize.py", tmp_path / "out" / "poptorch.conf"
    args = parse("t5", "--ipus", "4", "--ipu-plan", str(plan_file), "--ipu-code", str(code),
                 "--ipu-options", str(options))
    assert run_ipu(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("IPU placement of t5 4.5.1 T5ForConditionalGeneration (stateless form): 4 IPUs x 1 "
                          "replicas = 4 IPUs; training, gradient accumulation 11 (>= 2N-1)\n")
    assert "    2    0  decoder.embed_tokens   " in out
    assert "uses shared_embed_weight: on IPU 0 with its other users" in out
    assert f"wrote {code}\nwrote {options}\n" in out
    generated = code.read_text()
    assert "# regenerate: partition-model t5 --version 4.5.1 --class T5ForConditionalGeneration --target ipu --ipus 4 --ipu-form stateless\n" in generated
    namespace: dict = {}
    exec(compile(generated, str(code), "exec"), namespace)
    model = t5("stateless")
    namespace["parallelize"](model)
    assert sum(1 for m in model.modules() for h in m._forward_pre_hooks.values()
               if type(h).__name__ == "_BlockHook") == generated.count("poptorch.BeginBlock(")
    loaded = standin.Options().loadFromFile(str(options))
    assert ("Training.gradientAccumulation", (11,)) in loaded.calls


def test_the_plan_can_be_passed_in_and_the_config_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "ipu.json"
    config.write_text(json.dumps({"training": False, "inference_execution": "pipelined", "rebalance_shared": False,
                                  "available_memory_proportion": [0.2, 0.6, 0.6, 0.6]}))
    args = parse("t5", "--ipu-config", str(config), "--ipu-form", "stateful", "--ipu-code", str(tmp_path / "c.py"),
                 "--ipu-options", str(tmp_path / "o.conf"))
    assert run_ipu(args, t5_plan(t5("stateful"), 4, "stateful")) == 0
    assert "inference (pipelined), device iterations 5" in capsys.readouterr().out
    text = (tmp_path / "o.conf").read_text()
    assert "deviceIterations(5)" in text and "{'IPU0': 0.2, 'IPU1': 0.6" in text and "Training." not in text
    assert "if 'shared.weight' not in dict(model.named_parameters()):" in (tmp_path / "c.py").read_text()


@pytest.mark.parametrize("argv, message", [
    (("t5", "--ipus", "4"), "no plan to place: partition with --ipus N, or give --ipu-plan PLAN.json"),
    (("t5", "--ipus", "2", "--ipu-plan", "{plan}"), "ipus_per_replica is 2 but the placement uses 4 IPUs"),
    (("t5", "--ipu-plan", "{missing}"), "missing.json: No such file or directory"),
])
def test_errors_are_one_line_with_exit_code_2(tmp_path: Path, plan_file: Path, capsys: pytest.CaptureFixture[str],
                                              argv: tuple[str, ...], message: str) -> None:
    argv = tuple(a.format(plan=plan_file, missing=tmp_path / "missing.json") for a in argv)
    code = tmp_path / "c.py"
    assert run_ipu(parse(*argv, "--ipu-code", str(code))) == 2
    err = capsys.readouterr().err
    assert err.startswith("partition-model: error: ") and message in err and err.count("\n") == 1
    assert not code.exists()


def test_ipus_and_the_config_must_agree(tmp_path: Path, plan_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "ipu.json"
    config.write_text('{"ipus_per_replica": 8}')
    assert run_ipu(parse("t5", "--ipus", "4", "--ipu-config", str(config), "--ipu-plan", str(plan_file))) == 2
    assert "--ipus 4 but" in capsys.readouterr().err


def test_a_family_without_ipu_roles_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = t5_plan(t5("stateless"), 4, "stateless")
    plan.model["family"] = "nosuch"  # a family no recipe defines
    assert run_ipu(parse("nosuch", "--ipu-code", str(tmp_path / "c.py")), plan) == 2
    from families.family import definitions

    known = ", ".join(sorted(definitions()))
    assert f"the IPU target knows no family 'nosuch' (known: {known})" in capsys.readouterr().err
    assert {"t5", "gpt2", "bert", "roberta", "bart"} <= set(definitions())
