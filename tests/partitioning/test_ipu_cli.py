"""The IPU target: what ``partition-model t5 --version 4.5.1 --target ipu --ipus 4`` does once it has a plan."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support import poptorch_standin
from test_ipu_t5 import t5, t5_plan

from partitioning.cli import main
from partitioning.plan import Plan
from stateless.torch_internals import forward_pre_hooks


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "poptorch", poptorch_standin)  # the stand-in, not Graphcore's poptorch
    return poptorch_standin


def place(family: str, *argv: str) -> int:
    """partition-model placing the --ipu-plan file."""
    return main([family, "--version", "4.5.1", "--target", "ipu", *argv])


def write_plan(path: Path, plan: Plan) -> Path:
    path.write_text(plan.to_json())
    return path


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    return write_plan(tmp_path / "plan.json", t5_plan(t5("stateless"), 4, "stateless"))


def test_prints_the_placement_and_writes_code_and_options(standin, tmp_path: Path, plan_file: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, options = tmp_path / "out" / "ipu_parallelize.py", tmp_path / "out" / "poptorch.conf"
    assert place("t5", "--ipus", "4", "--ipu-plan", str(plan_file), "--ipu-code", str(code),
                 "--ipu-options", str(options)) == 0
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
    assert sum(1 for m in model.modules() for h in forward_pre_hooks(m).values()
               if type(h).__name__ == "_BlockHook") == generated.count("poptorch.BeginBlock(")
    loaded = standin.Options().loadFromFile(str(options))
    assert ("Training.gradientAccumulation", (11,)) in loaded.calls


def test_the_plan_can_be_passed_in_and_the_config_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "ipu.json"
    config.write_text(json.dumps({"training": False, "inference_execution": "pipelined", "rebalance_shared": False,
                                  "available_memory_proportion": [0.2, 0.6, 0.6, 0.6]}))
    plan = write_plan(tmp_path / "plan.json", t5_plan(t5("stateful"), 4, "stateful"))
    assert place("t5", "--ipu-config", str(config), "--ipu-form", "stateful", "--ipu-plan", str(plan),
                 "--ipu-code", str(tmp_path / "c.py"), "--ipu-options", str(tmp_path / "o.conf")) == 0
    assert "inference (pipelined), device iterations 5" in capsys.readouterr().out
    text = (tmp_path / "o.conf").read_text()
    assert "deviceIterations(5)" in text and "{'IPU0': 0.2, 'IPU1': 0.6" in text and "Training." not in text
    assert "if 'shared.weight' not in dict(model.named_parameters()):" in (tmp_path / "c.py").read_text()


@pytest.mark.parametrize("argv, message", [
    (("t5", "--ipus", "2", "--ipu-plan", "{plan}"), "ipus_per_replica is 2 but the placement uses 4 IPUs"),
    (("t5", "--ipu-plan", "{missing}"), "missing.json: No such file or directory"),
])
def test_errors_are_one_line_with_exit_code_2(tmp_path: Path, plan_file: Path, capsys: pytest.CaptureFixture[str],
                                              argv: tuple[str, ...], message: str) -> None:
    argv = tuple(a.format(plan=plan_file, missing=tmp_path / "missing.json") for a in argv)
    code = tmp_path / "c.py"
    assert place(*argv, "--ipu-code", str(code)) == 2
    err = capsys.readouterr().err
    assert err.startswith("partition-model: error: ") and message in err and err.count("\n") == 1
    assert not code.exists()


def test_ipus_and_the_config_must_agree(tmp_path: Path, plan_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "ipu.json"
    config.write_text('{"ipus_per_replica": 8}')
    assert place("t5", "--ipus", "4", "--ipu-config", str(config), "--ipu-plan", str(plan_file)) == 2
    assert "--ipus 4 but" in capsys.readouterr().err


def test_a_family_without_ipu_roles_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = t5_plan(t5("stateless"), 4, "stateless")
    plan.model["family"] = "nosuch"  # a family no recipe defines
    plan_file = write_plan(tmp_path / "plan.json", plan)
    assert place("nosuch", "--ipu-plan", str(plan_file), "--ipu-code", str(tmp_path / "c.py")) == 2
    from families.family import definitions

    known = ", ".join(sorted(definitions()))
    assert f"the IPU target knows no family 'nosuch' (known: {known})" in capsys.readouterr().err
    assert {"t5", "gpt2", "bert", "roberta", "bart"} <= set(definitions())
