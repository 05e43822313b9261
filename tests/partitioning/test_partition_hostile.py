"""partition-model under hostile and careless input (issue 14, part 3): one line, exit 2, nothing written or half-written.

Each test reproduces a case a new user ran into; the comment says what happened before.  Checks
that need no model are made before the slow costing: those tests make costing fail loudly
(``costing_fails``), so a check that slipped behind it shows up as an internal error.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import pytest
from test_ipu_t5 import t5, t5_plan

from common.atomic import is_temporary
from partitioning import cli, command
from partitioning.cost import chain as costing

TINY = {"d_model": 16, "d_ff": 24, "d_kv": 4, "num_heads": 2, "num_layers": 2, "vocab_size": 48,
        "relative_attention_num_buckets": 8, "decoder_start_token_id": 0, "pad_token_id": 0}
SMALL = ["--batch", "1", "--source-len", "8", "--target-len", "4"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory holding only the tiny config (outputs default to it)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.json").write_text(json.dumps(TINY))
    monkeypatch.chdir(work)
    return work


@pytest.fixture
def costing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def chain(*args, **kwargs):
        raise AssertionError("the slow costing ran before this input was checked")
    monkeypatch.setattr(costing, "cost_chain", chain)


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def rejected(argv: list[str], work: Path, capsys: pytest.CaptureFixture[str], expected: str) -> str:
    """partition-model exits 2 with one line containing ``expected`` and writes nothing."""
    before = files(work)
    capsys.readouterr()
    code = cli.main(argv)
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert code == 2 and captured.out == "", captured
    assert len(lines) == 1 and lines[0].startswith("partition-model: error: "), lines
    assert "internal error" not in lines[0] and expected in lines[0], lines[0]
    assert files(work) == before
    return lines[0]


def tiny(*argv: str) -> list[str]:
    return ["t5", "--version", "4.5.1", "--config", "tiny.json", *SMALL, *argv]


def write_config(work: Path, name: str, **changes: object) -> str:
    (work / name).write_text(json.dumps({**TINY, **changes}))
    return name


# -- the model's config file ---------------------------------------------------------------------------------------

BERT = {"model_type": "bert", "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 48}


@pytest.mark.parametrize("changes, expected", [
    ({"d_model": -512}, "d_model must be a positive integer, got -512"),  # RuntimeError traceback
    ({"d_model": "abc"}, "d_model must be an integer, got 'abc'"),  # exit 2, but torch's message about a tuple
    ({"num_layers": -3}, "num_layers must be a positive integer, got -3"),  # exit 0 and a plan with no layers
    ({"num_layers": 0}, "num_layers must be a positive integer, got 0"),
    ({"num_decoder_layers": 0}, "the model's decoder.block has no layers"),  # a decoder of nothing
    ({"dropout_rate": float("nan")}, "NaN is not a JSON number"),
    ({"feed_forward_proj": "swish"}, "cannot build T5ForConditionalGeneration from this config"),  # KeyError traceback
    ({"is_encoder_decoder": "yes"}, "is_encoder_decoder must be true or false"),
], ids=["d_model-negative", "d_model-abc", "num_layers-negative", "num_layers-zero", "decoder-empty", "NaN",
        "unknown-activation", "bool-as-string"])
def test_a_bad_model_config_is_one_line(work: Path, capsys, changes: dict, expected: str) -> None:
    name = write_config(work, "bad.json", **changes)
    rejected(["t5", "--version", "4.5.1", "--stages", "2", "--config", name, *SMALL], work, capsys, expected)


def test_a_token_id_every_shape_sets_may_be_0_not_negative(work: Path, capsys) -> None:
    """GPT-2's shapes set its pad id (its sequence classifier needs one); a fine-tuner's config may make it 0."""
    config = {"model_type": "gpt2", "n_embd": 16, "n_layer": 2, "n_head": 2, "vocab_size": 48, "n_positions": 32}
    (work / "gpt2.json").write_text(json.dumps({**config, "pad_token_id": 0}))
    assert cli.main(["gpt2", "--version", "4.5.1", "--class", "GPT2ForSequenceClassification", "--stages", "2",
                     "--config", str(work / "gpt2.json"), "--batch", "2", "--sequence-len", "8", "--output",
                     str(work / "gpt2-plan.json")]) == 0
    assert json.loads((work / "gpt2-plan.json").read_text())["model"]["config"]["pad_token_id"] == 0
    capsys.readouterr()
    (work / "gpt2.json").write_text(json.dumps({**config, "pad_token_id": -1}))
    rejected(["gpt2", "--version", "4.5.1", "--stages", "2", "--config", "gpt2.json"], work, capsys,
             "pad_token_id must be a non-negative integer (a token id), got -1")


def test_a_json_file_that_is_no_model_config_is_one_line(work: Path, capsys) -> None:
    # Before: a plan.json given as --config planned t5's default sizes (T5Config takes any keyword) and exit 0.
    (work / "plan.json").write_text(json.dumps({"model": {}, "blocks": [], "stages": []}))
    rejected(["t5", "--version", "4.5.1", "--stages", "2", "--config", "plan.json", "--output", "out.json"], work,
             capsys, "config plan.json sets none of a T5Config's sizes")


def test_a_config_of_another_model_type_is_one_line(work: Path, capsys) -> None:
    # Before: AttributeError: property 'hidden_size' of 'T5Config' object has no setter.
    (work / "bert.json").write_text(json.dumps(BERT))
    rejected(tiny("--stages", "2", "--config", "bert.json")[2:] and
             ["t5", "--version", "4.5.1", "--stages", "2", "--config", "bert.json"], work, capsys,
             "config bert.json is a 'bert' config (model_type), not 't5'")
    del BERT["model_type"]  # no model_type to go by: the read-only attribute is still one line
    (work / "bert.json").write_text(json.dumps(BERT))
    rejected(["t5", "--version", "4.5.1", "--stages", "2", "--config", "bert.json"], work, capsys,
             "bad T5Config: AttributeError: property 'hidden_size'")


@pytest.mark.parametrize("make, expected", [
    (lambda work: "/dev/zero", "not a regular file"),  # read without a cap
    (lambda work: str(work), "is a directory"),
    (lambda work: (work / "x.json").write_bytes(b"\xff\xfe{}") and "x.json", "is not UTF-8 text"),
    (lambda work: (work / "x.json").write_bytes(b" " * (1 << 21)) and "x.json", "larger than 1024 KiB"),
    (lambda work: (work / "x.json").write_text("[1]") and "x.json", "must be a JSON object, not list"),
], ids=["dev-zero", "directory", "not-utf8", "2MiB", "list"])
def test_every_read_of_a_config_file_is_capped(work: Path, capsys, costing_fails, make, expected: str) -> None:
    rejected(["t5", "--version", "4.5.1", "--stages", "2", "--config", make(work)], work, capsys, expected)


# -- flags ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag, value", [
    ("--device-flops", "inf"),  # before: exit 0 and Infinity in plan.json, which is not JSON
    ("--device-flops", "nan"), ("--device-flops", "0"), ("--bandwidth", "-25"), ("--bandwidth", "nan"),
    ("--memory-gb", "0"), ("--memory-gb", "inf"), ("--batch", "0"), ("--micro-batches", "-1"),
    ("--granularity", "0"), ("--optimizer-states", "-1"), ("--run-steps", "0"), ("--stages", "-2"),
    ("--source-len", "0"), ("--seq-len", "source=0"), ("--ipus", "0"), ("--threads", "0"),
    ("--memory-bandwidth", "inf"), ("--granularity", "fine"),
    ("--measure", "-1"),  # before: StatisticsError traceback
])
def test_numbers_in_every_numeric_flag_are_checked(work: Path, capsys, costing_fails, flag: str, value: str) -> None:
    rejected(tiny("--stages", "2", flag, value), work, capsys, f"argument {flag}: expected")


@pytest.mark.parametrize("flag", ["--batch", "--source-len"])
def test_a_micro_batch_too_large_for_torch_is_one_line_before_costing(work: Path, capsys, costing_fails,
                                                                      flag: str) -> None:
    # Before: "internal error: TypeError: randint(): argument 'size' failed to unpack ... Overflow" with 10^20.
    rejected(tiny("--stages", "2", flag, str(10**20)), work, capsys, "tokens is too large to cost")


@pytest.mark.parametrize("argv, expected", [
    (["t5", "--version", "4.5.1", "--stages", "x"], "argument --stages: expected an integer, got 'x'"),
    (["t5", "--stages", "2", "--version"], "argument --version: expected one argument"),
    (["t5", "--version", "4.5.1", "--stagez", "2"], "unrecognized arguments: --stagez 2"),
    (["t5", "--version", "4.5.1", "--target", "tpu"], "argument --target: invalid choice: 'tpu'"),
    (["t5", "--version", "4.5.1", "--shape", "t5-small", "--config", "c.json"], "not allowed with argument"),
])
def test_usage_errors_are_one_line(work: Path, capsys, argv: list[str], expected: str) -> None:
    # Before: argparse printed its 18-line usage first.
    line = rejected(argv, work, capsys, expected)
    assert line.endswith("(partition-model --help lists the options)")


def test_help_still_prints_and_exits_0(capsys) -> None:
    assert cli.main(["--help"]) == 0
    assert "--ipu-config" in capsys.readouterr().out


@pytest.mark.parametrize("argv, expected", [
    (["--device", "bogus"], "--device 'bogus' is not a torch device"),  # RuntimeError traceback
    (["--device", "cuda", "--measure", "1"], "--device cuda: cannot allocate there"),  # AssertionError traceback
    (["--device", "meta", "--measure", "1"], "--measure needs a real --device"),
    (["--stages", "3", "--micro-batches", "2", "--run"],  # torchrun, then a torch URL after 35 s
     "--run: the 1f1b schedule cannot run 2 micro-batches on 3 ranks x 1 chunks"),
    (["--stages", "2", "--target", "ipu", "--run"], "--run trains with torch.distributed.pipelining"),
    (["--stages", "2", "--plot", "p.png", "--output", "p.png"], "--output and --plot name the same file p.png"),
], ids=["device-bogus", "cuda-without-gpu", "measure-on-meta", "run-micro-batches", "run-ipu", "same-file"])
def test_flag_combinations_are_checked_before_costing(work: Path, capsys, costing_fails, argv: list[str],
                                                      expected: str) -> None:
    if "--stages" not in argv:
        argv = ["--stages", "2", *argv]
    rejected(tiny(*argv), work, capsys, expected)


# -- outputs: checked before the slow work, written all together -------------------------------------------------------

@pytest.mark.parametrize("make, expected", [
    (lambda work: "/dev/zero", "not a regular file"),
    (lambda work: str(work), "is a directory"),
    (lambda work: (work / "c.json").write_bytes(b"\xff{}") and "c.json", "is not UTF-8 text"),
    (lambda work: (work / "c.json").write_text("[1]") and "c.json", "c.json is not a calibration file"),
    (lambda work: (work / "c.json").write_text('{"flops": NaN}') and "c.json", "c.json is not a calibration file"),
], ids=["dev-zero", "directory", "not-utf8", "list", "NaN"])
def test_a_calibration_file_is_read_capped_and_checked_before_costing(work: Path, capsys, costing_fails, make,
                                                                      expected: str) -> None:
    rejected(tiny("--stages", "2", "--calibration", make(work)), work, capsys, expected)


def test_a_calibrate_destination_that_is_a_directory_is_refused_before_measuring(work: Path, capsys,
                                                                                   costing_fails) -> None:
    (work / "out").mkdir()
    rejected(tiny("--stages", "2", "--device", "cpu", "--calibrate", "out"), work, capsys,
             "--calibrate out is a directory: name a file")


@pytest.mark.parametrize("flag", ["--output", "--plot", "--module-to-device", "--ipu-code", "--ipu-options"])
def test_an_output_that_is_a_directory_is_refused_before_anything_is_written(work: Path, capsys, costing_fails,
                                                                             flag: str) -> None:
    # Before: plan.json (or the code) already written, a .tmp left, and for --output an error naming the temp file.
    (work / "out").mkdir()
    target = ["--target", "ipu", "--ipus", "2"] if flag.startswith("--ipu") else ["--stages", "2"]
    rejected(tiny(*target, flag, "out"), work, capsys, f"{flag} out is a directory: name a file")


@pytest.mark.parametrize("argv, expected", [
    (["--stages", "2", "--output", "tiny.json"], "--output tiny.json is the --config file this command reads"),
    (["--target", "ipu", "--ipus", "2", "--ipu-config", "ipu.json", "--ipu-code", "ipu.json"],
     "--ipu-code ipu.json is the --ipu-config file"),
], ids=["output-over-config", "code-over-ipu-config"])
def test_an_output_that_would_replace_an_input_is_refused(work: Path, capsys, costing_fails, argv: list[str],
                                                          expected: str) -> None:
    # Before: --output tiny.json replaced the config it was planned from; --ipu-code plan.json the plan it placed.
    (work / "ipu.json").write_text("{}")
    rejected(tiny(*argv), work, capsys, expected)


def test_placing_a_plan_never_writes_over_it(work: Path, capsys) -> None:
    (work / "plan.json").write_text(json.dumps(plan_data()))
    rejected(["t5", "--version", "4.5.1", "--target", "ipu", "--ipu-plan", "plan.json", "--ipu-code", "plan.json"],
             work, capsys, "--ipu-code plan.json is the --ipu-plan file this command reads")


def test_an_output_under_a_file_is_refused_before_anything_is_written(work: Path, capsys, costing_fails) -> None:
    rejected(tiny("--stages", "2", "--output", "tiny.json/plan.json"), work, capsys, "tiny.json is not a directory")


@pytest.mark.parametrize("argv, expected", [
    (["--ipus", "3"], "3 IPUs x 1 replicas = 3 IPUs, not a power of two"),
    (["--ipus", "4", "--ipu-config", "{config}"], "layers_per_ipu lists 3 values for 4 IPUs"),
    (["--ipus", "2", "--ipu-config", "{config}"], "--ipus 2 but"),
    (["--ipus", "4", "--batch", "2", "--ipu-config", "{batch}"], "--batch 2 but"),
], ids=["ipus-3", "config-lists", "config-ipus", "config-batch"])
def test_the_ipu_config_is_checked_before_costing(work: Path, capsys, costing_fails, argv: list[str],
                                                  expected: str) -> None:
    # Before: rejected only after the slow costing, with plan.json already written.
    (work / "ipu.json").write_text(json.dumps({"layers_per_ipu": [1, 1, 2], "ipus_per_replica": 4}))
    (work / "batch.json").write_text(json.dumps({"micro_batch_size": 4}))
    argv = [a.format(config="ipu.json", batch="batch.json") for a in argv]
    base = ["t5", "--version", "4.5.1", "--config", "tiny.json", "--target", "ipu"]
    rejected(base + argv, work, capsys, expected)


@pytest.mark.parametrize("content, expected", [
    ({"output_mode": []}, "output_mode must be one of"),  # TypeError: unhashable type: 'list'
    ({"layers_per_ipu": 5}, "layers_per_ipu must list layer counts"),  # TypeError: 'int' object is not iterable
    ({"recompute_checkpoints": 5}, "recompute_checkpoints must be a list of block names, got 5"),
    ({"recompute_checkpoints": "encoder.embed"}, 'got "encoder.embed" (one block: ["encoder.embed"])'),
    ({"gradient_accumulation": 1e400}, "Infinity is not a JSON number"),
], ids=["output_mode-list", "layers_per_ipu-int", "recompute-int", "recompute-string", "overflow"])
def test_a_mistyped_ipu_config_is_one_line_before_costing(work: Path, capsys, costing_fails, content: dict,
                                                          expected: str) -> None:
    (work / "ipu.json").write_text(json.dumps(content).replace("inf", "Infinity"))
    rejected(tiny("--target", "ipu", "--ipus", "4", "--ipu-config", "ipu.json"), work, capsys, expected)


def test_all_outputs_of_a_command_are_one_write(work: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[set[str]] = []
    real = command.write_outputs

    def recorded(outputs: Mapping[Path, bytes]) -> None:
        writes.append({Path(p).name for p in outputs})
        real(outputs)

    monkeypatch.setattr(command, "write_outputs", recorded)
    assert cli.main(tiny("--target", "ipu", "--ipus", "2", "--module-to-device", "map.json")) == 0
    assert writes == [{"plan.json", "map.json", "ipu_parallelize.py", "poptorch_options.conf"}]
    assert not [name for name in files(work) if is_temporary(Path(name).name)]


def test_numbers_that_overflow_once_scaled_are_refused_before_costing(work: Path, capsys, costing_fails) -> None:
    # Before: --device-flops inf gave exit 0 and Infinity in plan.json; 1e308 TFLOP/s is finite but not x 1e12.
    rejected(tiny("--stages", "2", "--device-flops", "1e308"), work, capsys, "must be finite and positive")
    rejected(tiny("--stages", "2", "--memory-gb", "1e300"), work, capsys, "the memory limit must be")


def test_the_plan_file_is_json_whatever_the_numbers(work: Path, capsys) -> None:
    assert cli.main(tiny("--stages", "2", "--device-flops", "1e-290", "--bandwidth", "1e-290")) == 0
    data = json.loads((work / "plan.json").read_text(), parse_constant=lambda name: pytest.fail(name))
    assert data["stages"][0]["compute"] > 1e200


# -- a plan file given to --ipu-plan (or edited by hand) --------------------------------------------------------------

def plan_data() -> dict:
    data = json.loads(t5_plan(t5("stateless"), 4, "stateless").to_json())
    data["model"]["config"] = {"tie_word_embeddings": True}  # as partition-model records it
    return data


def _edit(data: dict, path: str, value: object) -> dict:
    *keys, last = path.split("/")
    target = data
    for key in keys:
        target = target[int(key)] if key.isdigit() else target[key]
    if value is KeyError:
        del target[last]
    else:
        target[int(last) if last.isdigit() else last] = value
    return data


@pytest.mark.parametrize("path, value, expected", [
    ("model", KeyError, "model is missing"),  # KeyError traceback
    ("model", [], "model must be a JSON object, got []"),  # AttributeError traceback
    ("stages/0/compute", "fast", "stages[0].compute must be a finite number >= 0, got 'fast'"),  # TypeError later
    ("stages/0/blocks", "encoder.block.0", "stages[0].blocks must be a list of strings"),
    ("blocks/1/param_bytes", -4, "blocks[1].param_bytes must be an integer >= 0, got -4"),
    ("blocks/1/name", 7, "blocks[1].name must be a non-empty string, got 7"),
    ("blocks/1/speed", 1, "blocks[1] has an unknown field 'speed'"),
    ("stages/1/blocks", ["lm_head"], "the stages must cover every block once, in chain order"),
    ("model/family", ["t5"], "the plan's model.family must name the family"),
    ("model/config", "small", "the plan's model.config must be a JSON object"),
    ("model/config/tie_word_embeddings", "false", "config.tie_word_embeddings must be true or false, got 'false'"),
    ("settings/optimizer_states", -1, "settings.optimizer_states must be an integer >= 0, got -1"),
    ("settings/micro_batches", "8", "settings.micro_batches must be like 1, got '8'"),  # TypeError: '<' later
    ("settings/bandwidth", True, "settings.bandwidth must be like 25000000000.0, got True"),
    ("model/micro_batch", {"batch": 3, "lengths": {}}, "the plan was costed for micro-batches of 3, not 2"),
], ids=["no-model", "model-list", "compute-fast", "blocks-string", "negative-bytes", "name-int", "unknown-field",
        "stages-mismatch", "family-list", "config-string", "tie-flag-string", "optimizer-states", "micro-batches-string",
        "bandwidth-bool", "batch"])
def test_a_broken_plan_file_is_one_line(work: Path, capsys, path: str, value: object, expected: str) -> None:
    (work / "plan.json").write_text(json.dumps(_edit(plan_data(), path, value)))
    extra = ["--batch", "2"] if path == "model/micro_batch" else []
    rejected(["t5", "--version", "4.5.1", "--target", "ipu", "--ipu-plan", "plan.json", *extra], work, capsys,
             expected)


@pytest.mark.parametrize("content, expected", [
    (b'{"model": {}, "blocks": \xff}', "plan plan.json is not UTF-8 text"),  # UnicodeDecodeError traceback
    (b'{"model": {}, "blocks": [], "stages": NaN}', "NaN is not a JSON number"),
    (b"[]", "the top level must be a JSON object"),
], ids=["not-utf8", "NaN", "list"])
def test_an_unreadable_plan_file_is_one_line(work: Path, capsys, content: bytes, expected: str) -> None:
    (work / "plan.json").write_bytes(content)
    rejected(["t5", "--version", "4.5.1", "--target", "ipu", "--ipu-plan", "plan.json"], work, capsys, expected)
    rejected(["t5", "--version", "4.5.1", "--target", "ipu", "--ipu-plan", "/dev/zero"], work, capsys,
             "not a regular file")


# -- signals and dying ranks (child processes: real signals) -----------------------------------------------------------

def partition_model(argv: list[str], cwd: Path, hook: str = "", env: dict[str, str] | None = None
                    ) -> subprocess.Popen[str]:
    code = f"import sys\n{hook}\nfrom partitioning.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.Popen([sys.executable, "-c", code, *argv], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_costing_is_one_line_and_writes_nothing(work: Path, signum: int) -> None:
    hook = ("import os, signal\nfrom partitioning.cost import chain\n"
            f"chain.cost_chain = lambda *a, **k: os.kill(os.getpid(), {int(signum)})")
    child = partition_model(tiny("--stages", "2"), work, hook)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 2 and err == "partition-model: interrupted\n", err
    assert files(work) == {"tiny.json"}


def _ranks(plan: Path) -> dict[int, int]:
    """RANK -> pid of the training processes of ``plan`` (torchrun's children)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"partitioning.gpu.train" in command and str(plan).encode() in command and b"-m" in command:
            rank = [v for v in environ if v.startswith(b"RANK=")]
            if rank and b"torch.distributed.run" not in command:
                found[int(rank[0][5:])] = int(entry.name)
    return found


def _run(work: Path) -> tuple[subprocess.Popen[str], dict[int, int], Path]:
    scratch = work.parent / "tmp"
    scratch.mkdir()
    # torch keeps its compile cache under $TMPDIR/torchinductor_$USER, created on import and reused by every torch
    # process: not a leftover of this run, so it goes elsewhere and scratch holds only what partition-model makes.
    env = {**os.environ, "TMPDIR": str(scratch), "PYTHONPATH": os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]]),
           "TORCHINDUCTOR_CACHE_DIR": str(work.parent / "inductor")}
    plan = work / "plan.json"
    child = partition_model(tiny("--stages", "2", "--run", "--run-steps", "100000", "--output", str(plan)), work,
                            env=env)
    deadline = time.monotonic() + 240
    ranks: dict[int, int] = {}
    while len(ranks) < 2 and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.5)
        ranks = _ranks(plan)
    assert len(ranks) == 2, child.communicate()
    time.sleep(3)  # let them start training
    return child, ranks, scratch


def test_a_rank_that_dies_is_reported_in_one_line_and_nothing_is_left(work: Path) -> None:
    child, ranks, scratch = _run(work)
    os.kill(ranks[1], signal.SIGKILL)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 2
    assert err.count("\n") == 1 and err.startswith("partition-model: error: the pipelined run failed"), err
    assert "rank 1" in err and "SIGKILL" in err, err
    assert _ranks(work / "plan.json") == {}
    assert list(scratch.iterdir()) == []  # torchrun's log directory and the ranks' temporaries are gone


def test_sigterm_during_a_run_stops_every_rank(work: Path) -> None:
    child, ranks, scratch = _run(work)
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 2 and err == "partition-model: interrupted\n", err
    assert _ranks(work / "plan.json") == {}
    assert list(scratch.iterdir()) == []
