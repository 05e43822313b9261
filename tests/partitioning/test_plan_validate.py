"""Issue 23 ("exit 0 means it works"), partition-model's side: inputs the model cannot take, IPU layouts, generated
code and user files, validation gaps.  Each case once exited 0 with a wrong plan or ended in "internal error".

Every refusal is one line, exit 2, nothing written (``rejected``); the limits come from the recipe's
``[model.limits]`` evaluated on the config, so the configs here are tiny and nothing slow is costed.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_partition_hostile import TINY, files, rejected

from common import generated
from common.errors import UserError
from common.schema import read
from families import limits
from families.family import ModelFamily
from partitioning import cli
from partitioning.gpu import launch
from partitioning.plan import Block
from partitioning.settings import Settings
from partitioning.solve.partition import partition

REPO = Path(__file__).resolve().parents[2]
GPT2 = {"model_type": "gpt2", "n_embd": 32, "n_head": 2, "n_layer": 2, "vocab_size": 100, "n_positions": 64,
        "n_ctx": 64}
BART = {"model_type": "bart", "d_model": 16, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 24, "decoder_ffn_dim": 24, "vocab_size": 64,
        "max_position_embeddings": 32}
ROBERTA = {"model_type": "roberta", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
           "intermediate_size": 24, "vocab_size": 64, "max_position_embeddings": 34, "pad_token_id": 1}


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, config in (("t5.json", TINY), ("gpt2.json", GPT2), ("bart.json", BART), ("roberta.json", ROBERTA)):
        (tmp_path / name).write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def config(work: Path, name: str, base: dict, **changes: object) -> str:
    (work / name).write_text(json.dumps({**base, **changes}))
    return name


def plan(family: str, *argv: str) -> list[str]:
    return [family, "--version", "4.5.1", "--stages", "2", "--batch", "1", *argv]


# -- inputs the model cannot take ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    # RoBERTa's positions start after the padding index: 34 - 1 - 1 = 32 (was: a plan for 33).
    (plan("roberta", "--config", "roberta.json", "--sequence-len", "33"),
     "at most max_position_embeddings - pad_token_id - 1 = 34 - 1 - 1 = 32 positions"),
    (plan("bart", "--config", "bart.json", "--source-len", "33"), "a source length of 33 is more"),  # was a plan
    (plan("bart", "--config", "bart.json", "--source-len", "16", "--target-len", "33"), "a target length of 33"),
    (plan("gpt2", "--config", "gpt2.json", "--sequence-len", "65"), "at most n_positions = 64"),  # internal error
    # the recipe's default shapes, as the issue ran them
    (plan("bert", "--sequence-len", "1024"), "at most max_position_embeddings = 512"),  # internal error
    (plan("roberta", "--sequence-len", "600"), "= 514 - 1 - 1 = 512"),
    (plan("gpt2", "--sequence-len", "2048"), "at most n_positions = 1024"),
    (plan("bart", "--source-len", "2048"), "at most max_position_embeddings = 1024"),
])
def test_lengths_past_the_position_table(argv, expected, work, capsys):
    assert "hint: --seq-len" in rejected(argv, work, capsys, expected)


def test_the_limit_itself_plans(work, capsys):
    assert cli.main(plan("roberta", "--config", "roberta.json", "--sequence-len", "32", "--output", "p.json")) == 0
    assert json.loads((work / "p.json").read_text())["model"]["micro_batch"]["lengths"] == {"sequence": 32}


@pytest.mark.parametrize("name, base, changes, expected", [
    ("nohead.json", GPT2, {"n_head": None}, "n_embd (32) must be a multiple of n_head (12)"),  # "AssertionError:"
    ("heads.json", GPT2, {"n_head": 3}, "n_embd (32) must be a multiple of n_head (3)"),
    ("ctx.json", GPT2, {"n_ctx": 8}, "at most n_ctx = 8"),  # the causal-mask buffer is n_ctx x n_ctx
    ("bheads.json", BART, {"decoder_attention_heads": 3}, "d_model (16) must be a multiple of decoder_attention_heads"),
    ("ckpt.json", GPT2, {"gradient_checkpointing": True}, "sets gradient_checkpointing = True"),  # internal error
])
def test_config_the_model_cannot_take(name, base, changes, expected, work, capsys):
    values = {key: value for key, value in {**base, **changes}.items() if value is not None}
    (work / name).write_text(json.dumps(values))
    lengths = ["--source-len", "16", "--target-len", "16"] if base is BART else ["--sequence-len", "16"]
    rejected(plan(base["model_type"], "--config", name, *lengths), work, capsys, expected)


def test_a_false_gradient_checkpointing_is_fine(work):
    name = config(work, "ok.json", GPT2, gradient_checkpointing=False)  # real config.json files carry the key
    assert cli.main(plan("gpt2", "--config", name, "--sequence-len", "16", "--output", "p.json")) == 0


def test_limit_bounds_are_checked_data():
    with pytest.raises(UserError, match=r"lengths.sequence\[0\] must be config attributes"):
        read(limits.LimitsSection, {"lengths": {"sequence": ["n_positions; import os"]}}, "recipe")
    assert limits.value("a - b + 3", type("C", (), {"a": 10, "b": 4})()) == (9, "10 - 4 + 3")
    assert limits.value("missing", object()) is None  # an attribute a release's config lacks: no bound


# -- numbers that overflow ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["--bandwidth", "1e-320"], "too close to 0"),  # subnormal: was an empty AssertionError
    (["--device-flops", "1e-320"], "too close to 0"),
    (["--memory-bandwidth", "5e-324"], "too close to 0"),
    (["--source-len", "2147483647"], "too large to cost"),  # a 2^31 x 2^31 attention score matrix
])
def test_numbers_past_what_costing_can_hold(argv, expected, work, capsys):
    rejected(plan("t5", "--config", "t5.json", *argv), work, capsys, expected)


def test_costs_that_overflow():
    """Normal rates, but a stage's time is past the largest float (was: an empty AssertionError)."""
    blocks = [Block(name=f"b{i}", modules=(f"b{i}",), flops=1e300, param_bytes=4, out_bytes=4) for i in range(3)]
    with pytest.raises(UserError, match="the stage times overflow"):
        partition(blocks, 2, Settings(device_flops=1e-10))


# -- calibration files -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, expected", [
    ("seconds", "Infinity is not a JSON number"),
    ("backward_factor", "backward_factor must be a finite number"),
    ("model", "model must be a table"),
])
def test_hostile_calibration(change, expected, work, capsys):
    calibration = {"format": 1, "device": "cpu", "backend": "gloo", "machine": "x", "threads": 1, "flops": 1e9,
                   "bandwidth": 1e9, "memory_bandwidth": 1e9, "backward_factor": 2.0, "model": {},
                   "blocks": [{"name": "encoder.embed", "seconds": 1e-3, "flops": 0.0, "activation_bytes": 8}]}
    text = {"seconds": json.dumps(calibration).replace("0.001", "Infinity"),
            "backward_factor": json.dumps({**calibration, "backward_factor": "2"}),
            "model": json.dumps({**calibration, "model": [1]})}[change]
    (work / "cal.json").write_text(text)
    rejected(plan("t5", "--config", "t5.json", "--calibration", "cal.json"), work, capsys, expected)


# -- the installed transformers release --------------------------------------------------------------------------------

def test_another_release_on_the_path_is_named(tmp_path):
    fake = tmp_path / "transformers"
    fake.mkdir()
    (fake / "__init__.py").write_text("__version__ = '9.9.9'\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path), os.environ["PYTHONPATH"]])}
    done = subprocess.run([sys.executable, "-m", "partitioning.cli", "gpt2", "--version", "4.5.1", "--stages", "2",
                           "--output", str(tmp_path / "p.json")], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == "", done
    line, = done.stderr.splitlines()
    assert "the one that imports here is transformers 9.9.9" in line and "recipe" not in line, line
    assert not (tmp_path / "p.json").exists()


def test_family_release_check():
    ModelFamily.load("t5", "4.5.1").require_release()
    with pytest.raises(UserError, match="imports here is transformers 4.5.1"):
        ModelFamily.load("t5", "4.10.3").require_release()


# -- a rank's failure --------------------------------------------------------------------------------------------------

def test_a_ranks_error_is_its_cause():
    """torchrun's output as launch reads it: the first rank's own line is the cause, not the peers' after it."""
    script = ("import sys\nprint('partitioning.gpu.train (rank 0): error: IndexError: index out of range')\n"
              "print('partitioning.gpu.train (rank 1): error: RuntimeError: Connection closed by peer')\n"
              "print('rank 0 exited with code 1')\nsys.exit(1)\n")
    with pytest.raises(UserError) as raised:
        launch._torchrun([sys.executable, "-c", script], dict(os.environ))
    assert raised.value.one_line() == ("the pipelined run failed (torchrun exit 1): partitioning.gpu.train (rank 0): "
                                       "error: IndexError: index out of range")


def test_a_rank_reports_an_unforeseen_error_in_one_line(work, capsys):
    """A plan whose inputs index past the vocabulary: the rank names the root cause (was: a traceback only)."""
    assert cli.main(["gpt2", "--version", "4.5.1", "--config", "gpt2.json", "--stages", "1", "--batch", "1",
                     "--sequence-len", "4", "--micro-batches", "1", "--output", "p.json"]) == 0
    bad = json.loads((work / "p.json").read_text())
    for spec in bad["model"]["inputs"]:
        if spec["name"] == "input_ids":
            spec["high"] = 1000
    (work / "bad.json").write_text(json.dumps(bad))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29623",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]])}
    done = subprocess.run([sys.executable, "-m", "partitioning.gpu.train", "--plan", "bad.json", "--steps", "1"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last.startswith("partitioning.gpu.train (rank 0): error: IndexError: index out of range"), last


# -- the @generated rule, and text reaching generated files ------------------------------------------------------------

def test_literal_text():
    assert generated.literal_text("partition-model t5 --version 4.5.1") == "partition-model t5 --version 4.5.1"
    for hostile in ("x\nimport os as INJECTED\n#", 'a"""b', "a\\N{x}", "a\rb", "a\x0cb"):
        text = generated.literal_text(hostile)
        assert "\n" not in text and "\r" not in text and ast.literal_eval(text) == hostile
        ast.parse(f'"""{text}"""\n# {text}\n')


def test_refuse_foreign(tmp_path):
    mine, theirs = tmp_path / "mine.py", tmp_path / "theirs.py"
    mine.write_text("# @generated by partition-model\nx = 1\n")
    theirs.write_text("# edited\nx = 1\n")
    generated.refuse_foreign(mine, "partition-model", "hint")
    generated.refuse_foreign(tmp_path / "missing.py", "partition-model", "hint")
    with pytest.raises(UserError, match="refusing to replace .*theirs.py: partition-model did not write it"):
        generated.refuse_foreign(theirs, "partition-model", "hint")
    assert files(tmp_path) == {"mine.py", "theirs.py"}


# -- the IPU target ----------------------------------------------------------------------------------------------------

def ipu(*argv: str) -> list[str]:  # tiny T5 on 2 IPUs
    return ["t5", "--version", "4.5.1", "--target", "ipu", "--ipus", "2", "--batch", "1", "--source-len", "8",
            "--target-len", "4", *argv]


def test_sublayer_plans_have_no_layers_per_ipu(work, capsys):
    """Was ``layers_per_ipu [0, 0]``: sub-layer blocks were counted as no layer at all."""
    assert cli.main(ipu("--config", "t5.json", "--granularity", "sublayer")) == 0
    out = capsys.readouterr().out
    assert "layers_per_ipu none (the plan splits layer" in out or "layers_per_ipu [" in out
    assert "layers_per_ipu [0, 0]" not in out
    assert cli.main(ipu("--config", "t5.json", "--granularity", "1")) == 0
    counts = json.loads(capsys.readouterr().out.split("layers_per_ipu ")[1].split("\n")[0].split(";")[0])
    assert sum(counts) == 4  # 2 encoder + 2 decoder layers


@pytest.mark.parametrize("argv, expected", [
    (["gpt2", "--version", "4.5.1"], "plan for family 't5', not 'gpt2'"),
    (["t5", "--version", "4.10.3"], "plan for version '4.5.1', not '4.10.3'"),
    (["t5", "--version", "4.5.1", "--shape", "t5-base"], "plan for shape 't5.json', not 't5-base'"),
    (["t5", "--version", "4.5.1", "--class", "T5Model"], "plan for class 'T5ForConditionalGeneration', not 'T5Model'"),
    (["t5", "--version", "4.5.1", "--source-len", "16"], "costed for a source length of 8, not 16"),
])
def test_ipu_plan_of_another_model(argv, expected, work, capsys):
    assert cli.main(ipu("--config", "t5.json", "--output", "t5plan.json", "--ipu-code", "a.py",
                        "--ipu-options", "a.conf")) == 0
    rejected([*argv, "--target", "ipu", "--ipu-plan", "t5plan.json", "--ipu-code", "b.py", "--ipu-options", "b.conf"],
             work, capsys, expected)


def test_layerdrop_is_refused_on_ipu(work, capsys):
    name = config(work, "drop.json", BART, encoder_layerdrop=0.3)
    rejected(["bart", "--version", "4.5.1", "--config", name, "--target", "ipu", "--ipus", "2", "--batch", "1",
              "--source-len", "8", "--target-len", "4"], work, capsys, "sets encoder_layerdrop = 0.3")


def test_hostile_text_stays_literal_in_generated_files(work, capsys):
    """A plan's shape (or a config file's name) with line breaks: once an `import` line of the generated module."""
    assert cli.main(ipu("--config", "t5.json", "--output", "t5plan.json", "--ipu-code", "a.py",
                        "--ipu-options", "a.conf")) == 0
    hostile = json.loads((work / "t5plan.json").read_text())
    hostile["model"]["shape"] = "x\nimport os as INJECTED\n#"
    (work / "hostile.json").write_text(json.dumps(hostile))
    assert cli.main(["t5", "--version", "4.5.1", "--target", "ipu", "--ipu-plan", "hostile.json", "--ipu-code", "b.py",
                     "--ipu-options", "b.conf"]) == 0
    code = (work / "b.py").read_text()
    tree = ast.parse(code)
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Import) and node.names[0].asname == "INJECTED"]
    assert all(line.startswith("#") or "INJECTED" not in line for line in code.splitlines())
    options = (work / "b.conf").read_text().splitlines()
    assert options[0].startswith("#") and "INJECTED" in options[0] and not any("INJECTED" in o for o in options[1:])


def test_an_edited_ipu_module_is_kept(work, capsys):
    assert cli.main(ipu("--config", "t5.json", "--ipu-code", "a.py", "--ipu-options", "a.conf")) == 0
    assert generated.is_generated(generated_code := (work / "a.py").read_text())
    assert cli.main(ipu("--config", "t5.json", "--ipu-code", "a.py", "--ipu-options", "a.conf")) == 0  # still ours
    edited = "".join(generated_code.splitlines(keepends=True)[1:]) + "# my change\n"  # as the file tells its user
    (work / "a.py").write_text(edited)
    (work / "plan.json").unlink()
    rejected(ipu("--config", "t5.json", "--ipu-code", "a.py", "--ipu-options", "a.conf"), work, capsys,
             "refusing to replace a.py: partition-model did not write it")
    assert (work / "a.py").read_text() == edited


# -- save_pretrained of a stateless model ------------------------------------------------------------------------------

def test_stateless_model_saves_a_stock_checkpoint(tmp_path):
    """Was: a checkpoint without the embedding; from_pretrained re-initialized wte and lm_head with a log line."""
    import torch
    from support.gpt2_models import generated
    from transformers import GPT2Config
    from transformers import GPT2LMHeadModel as StockGPT2LMHeadModel

    torch.manual_seed(0)
    model = generated.GPT2LMHeadModel(GPT2Config(**{k: v for k, v in GPT2.items() if k != "model_type"})).make_stateless()
    model.save_pretrained(tmp_path)
    loaded = StockGPT2LMHeadModel.from_pretrained(tmp_path)  # the stock class: the checkpoint is in stock form
    assert torch.equal(loaded.transformer.wte.weight, model.shared_embed_weight)
    assert torch.equal(loaded.lm_head.weight, model.shared_embed_weight)
    assert "save_pretrained" not in model.make_stateful().__dict__  # the stateful form saves as the class does
