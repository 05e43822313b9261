"""The IPU config: JSON loading, poptorch.Options and PopTorch's options-file format."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from support import poptorch_standin

from common.errors import UserError
from partitioning.ipu.config import IPUConfig
from partitioning.ipu.errors import IPUError

TRAINING = IPUConfig(ipus_per_replica=4, gradient_accumulation=9, device_iterations=2, replication_factor=2,
                     available_memory_proportion=(0.2, 0.6, 0.6, 0.5), executable_cache_dir="/tmp/it's cached",
                     enable_half_partials=True, stochastic_rounding=True, output_mode="all")


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):
    """poptorch is the stand-in (tests/poptorch_standin.py), not Graphcore's."""
    monkeypatch.setitem(sys.modules, "poptorch", poptorch_standin)
    return poptorch_standin


@pytest.fixture
def no_poptorch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "poptorch", None)  # makes `import poptorch` fail, as without the SDK


def test_load_reads_lists_as_tuples(tmp_path: Path) -> None:
    path = tmp_path / "ipu.json"
    path.write_text(json.dumps({"training": False, "layers_per_ipu": [-1, 2, -1, 2], "replication_factor": 2,
                                "available_memory_proportion": [0.3, 0.6], "recompute_checkpoints": ["a"]}))
    config = IPUConfig.load(path)
    assert config == IPUConfig(training=False, layers_per_ipu=(-1, 2, -1, 2), replication_factor=2,
                               available_memory_proportion=(0.3, 0.6), recompute_checkpoints=("a",))


def test_unknown_key_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "ipu.json"
    path.write_text('{"gradient_accumulation_steps": 8}')
    with pytest.raises(IPUError, match=r"unknown key 'gradient_accumulation_steps' \(known: .*gradient_accumulation,"):
        IPUConfig.load(path)


def test_not_json_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "ipu.json"
    path.write_text("replication_factor = 2")
    with pytest.raises(IPUError, match="is not JSON"):
        IPUConfig.load(path)


@pytest.mark.parametrize("settings, message", [
    ({"replication_factor": 0}, "replication_factor must be a positive integer"),
    ({"replication_factor": None}, "replication_factor .* must be positive integers, got null"),
    ({"gradient_accumulation": True}, "gradient_accumulation must be a positive integer"),
    ({"available_memory_proportion": 1.5}, r"available_memory_proportion must be a number in \(0, 1\]"),
    ({"available_memory_proportion": []}, r"available_memory_proportion must be a number in \(0, 1\] .*got \[\]"),
    ({"output_mode": "everything"}, 'output_mode must be one of all, sum, final, default, got "everything"'),
    ({"layers_per_ipu": [2, -2]}, "layers_per_ipu must list layer counts >= 0 or -1"),
    ({"training": "yes"}, "training must be true or false"),
    ({"inference_execution": "phased"}, 'inference_execution must be one of sharded, pipelined, got "phased"'),
    ({"embedding_serialization_factor": 0}, "embedding_serialization_factor must be a positive integer"),
    ({"optimizer_state_offchip": "true"}, "optimizer_state_offchip must be true or false"),
    ({"executable_cache_dir": 7}, "executable_cache_dir must be a path string, got 7"),
])
def test_bad_values_are_rejected(settings: dict, message: str) -> None:
    with pytest.raises(IPUError, match=message):
        IPUConfig.from_dict(settings)


# Issue 14 part 3: each was a TypeError traceback (or, for the string, read a character at a time: "unknown block 'e'").
@pytest.mark.parametrize("settings, message", [
    ({"output_mode": []}, "output_mode must be one of all, sum, final, default, got \\[\\]"),
    ({"layers_per_ipu": 5}, "layers_per_ipu must list layer counts >= 0 or -1 \\(wildcard\\), got 5"),
    ({"recompute_checkpoints": 5}, "recompute_checkpoints must be a list of block names, got 5"),
    ({"recompute_checkpoints": "encoder.embed"},
     'recompute_checkpoints must be a list of block names, got "encoder.embed" \\(one block: \\["encoder.embed"\\]\\)'),
    ({"recompute_checkpoints": [["a"]]}, "recompute_checkpoints must be a list of block names"),
    ({"layers_per_ipu": {"a": 1}}, "layers_per_ipu must list layer counts"),
], ids=["output_mode-list", "layers_per_ipu-int", "recompute-int", "recompute-string", "recompute-nested",
        "layers_per_ipu-object"])
def test_mistyped_values_are_one_line_errors(tmp_path: Path, settings: dict, message: str) -> None:
    path = tmp_path / "ipu.json"
    path.write_text(json.dumps(settings))
    with pytest.raises(IPUError, match=f"IPU config {path}: {message}"):
        IPUConfig.load(path)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("make, message", [
    (lambda tmp: _write(tmp, "nan.json", b'{"available_memory_proportion": NaN}'), "NaN is not a JSON number"),
    (lambda tmp: _write(tmp, "latin1.json", b'{"executable_cache_dir": "caf\xe9"}'), "is not UTF-8 text"),
    (lambda tmp: _write(tmp, "big.json", b" " * (2 << 20) + b"{}"), "larger than 1024 KiB"),
    (lambda tmp: Path("/dev/zero"), "not a regular file"),
    (lambda tmp: tmp, "Is a directory|is a directory"),
    (lambda tmp: _write(tmp, "list.json", b"[1, 2]"), "must be a JSON object, not list"),
], ids=["NaN", "not-utf8", "2MiB", "dev-zero", "directory", "list"])
def test_reading_the_file_is_capped_and_strict(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(IPUError, match=message):
        IPUConfig.load(make(tmp_path))


def test_family_defaults_apply_under_the_users_settings(tmp_path: Path) -> None:
    path = tmp_path / "ipu.json"
    path.write_text('{"embedding_serialization_factor": 4}')
    defaults = {"embedding_serialization_factor": 2, "optimizer_state_offchip": True}
    config = IPUConfig.load(path, defaults)
    assert (config.embedding_serialization_factor, config.optimizer_state_offchip) == (4, True)
    with pytest.raises(IPUError, match="the family: optimizer_state_offchip must be true or false"):
        IPUConfig.from_dict({}, "the family", {"optimizer_state_offchip": 1})


def test_resolved_fills_the_least_values_poptorch_accepts() -> None:
    assert IPUConfig().resolved(4, 5) == IPUConfig(ipus_per_replica=4, gradient_accumulation=9, device_iterations=1)
    pipelined = IPUConfig(training=False, inference_execution="pipelined").resolved(4, 5)
    assert (pipelined.gradient_accumulation, pipelined.device_iterations) == (1, 5)
    explicit = IPUConfig(gradient_accumulation=32, device_iterations=4).resolved(4, 5)
    assert (explicit.gradient_accumulation, explicit.device_iterations) == (32, 4)


def test_training_options_file_is_pipelined_with_auto_increment() -> None:
    text = TRAINING.options_text("title")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [
        "autoRoundNumIPUs(False)",
        "replicationFactor(2)",
        "deviceIterations(2)",
        "Training.gradientAccumulation(9)",
        "TensorLocations.setOptimizerLocation(poptorch.TensorLocationSettings().useOnChipStorage(True)"
        ".useReplicatedTensorSharding(False))",
        "setExecutionStrategy(poptorch.PipelinedExecution(poptorch.AutoStage.AutoIncrement))",
        "outputMode(poptorch.OutputMode.All)",
        "setAvailableMemoryProportion({'IPU0': 0.2, 'IPU1': 0.6, 'IPU2': 0.6, 'IPU3': 0.5})",
        '''enableExecutableCaching("/tmp/it's cached")''',
        "Precision.enableStochasticRounding(True)",
        'Precision.setPartialsType(__import__("torch").float16)',
    ]


def test_inference_is_sharded_and_sets_no_training_option() -> None:
    config = IPUConfig(training=False).resolved(2, 3)
    text = config.options_text("title")
    assert "setExecutionStrategy(poptorch.ShardedExecution(poptorch.AutoStage.AutoIncrement))" in text
    assert "Training." not in text
    assert "setAvailableMemoryProportion({'IPU0': 0.6, 'IPU1': 0.6})" in text


def test_options_file_loads_into_the_same_options_as_the_api(standin, tmp_path: Path) -> None:
    path = tmp_path / "poptorch.conf"
    path.write_text(TRAINING.options_text("title"))
    from_file = standin.Options().loadFromFile(str(path))
    built = TRAINING.to_poptorch_options()
    assert from_file.calls == built.calls
    assert ("Precision.setPartialsType", (torch.float16,)) in built.calls
    assert ("setExecutionStrategy", (standin.PipelinedExecution(standin.AutoStage.AutoIncrement),)) in built.calls


def test_options_need_the_placements_derived_values() -> None:
    with pytest.raises(IPUError, match="build the options from a placement's config"):
        IPUConfig().options_text("title")


def test_without_poptorch_the_file_works_and_the_api_says_why_not(no_poptorch, tmp_path: Path) -> None:
    path = tmp_path / "poptorch.conf"
    path.write_text(TRAINING.options_text("title"))
    assert "Training.gradientAccumulation(9)" in path.read_text()
    with pytest.raises(IPUError, match="poptorch is required .* ships only with Graphcore's Poplar SDK"):
        TRAINING.to_poptorch_options()


def test_optimizer_state_location_follows_the_config(standin) -> None:
    sharded = IPUConfig(ipus_per_replica=4, gradient_accumulation=9, device_iterations=1, replication_factor=2,
                        optimizer_state_offchip=True, replicated_tensor_sharding=True)
    assert ("TensorLocations.setOptimizerLocation(poptorch.TensorLocationSettings().useOnChipStorage(False)"
            ".useReplicatedTensorSharding(True))") in sharded.options_text("title")
    settings = dict(sharded.to_poptorch_options().calls)["TensorLocations.setOptimizerLocation"][0]
    assert settings.settings == {"onChip": False, "replicatedTensorSharding": True}
    alone = IPUConfig(ipus_per_replica=4, gradient_accumulation=9, device_iterations=1, replicated_tensor_sharding=True)
    assert ".useReplicatedTensorSharding(False))" in alone.options_text("title")  # one replica: nothing to shard over
    inference = IPUConfig(training=False).resolved(4, 4).options_text("title")
    assert "TensorLocations" not in inference and "Precision.enableStochasticRounding(False)" in inference


def test_every_recipes_ipu_section_reads() -> None:
    from families.registry import definitions
    from partitioning.ipu.section import ipu_section

    sections = {name: ipu_section(definition) for name, definition in definitions().items()}
    assert sections["t5"].defaults["ipus_per_replica"] == 4
    published = sections["t5"].layout("t5-small")
    assert published is not None and published.layers_per_ipu == (0, 3, 4, 5)


@pytest.mark.parametrize("edit, message", [
    ({"ipus_per_replica": 0}, "recipe t5.toml: ipu.ipus_per_replica must be a positive integer, got 0"),
    ({"half_precison": True}, "recipe t5.toml: unknown key 'ipu.half_precison' (known there: "),
    ({"available_memory_proportion": float("nan")}, "ipu.available_memory_proportion must be a number in (0, 1]"),
    ({"published": {"t5-small": {"ipus": 2, "layers_per_ipu": [1, 2, 3], "source": "x"}}},
     "ipu.published.t5-small.layers_per_ipu must list 2 layer counts"),
    ({"published": {"t5-tiny": {"ipus": 1, "layers_per_ipu": [1], "source": "x"}}},
     "unknown key 'ipu.published.t5-tiny' (known there: "),
], ids=["zero", "misspelled", "NaN", "layout-length", "unknown-shape"])
def test_a_malformed_ipu_section_is_one_line_naming_the_key(edit: dict, message: str) -> None:
    from dataclasses import replace

    from families.registry import definition
    from partitioning.ipu.section import ipu_section

    t5 = definition("t5")
    broken = replace(t5, sections={"ipu": {**t5.sections["ipu"], **edit}})
    with pytest.raises(UserError) as raised:
        ipu_section(broken)
    assert message in str(raised.value)
