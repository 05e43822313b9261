"""The IPU config: JSON loading, poptorch.Options and PopTorch's options-file format."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import poptorch_standin
import pytest
import torch

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
    ({"gradient_accumulation": True}, "gradient_accumulation must be a positive integer"),
    ({"available_memory_proportion": 1.5}, r"values must be in \(0, 1\]"),
    ({"output_mode": "everything"}, "output_mode 'everything' is not one of all, sum, final, default"),
    ({"layers_per_ipu": [2, -2]}, "layers_per_ipu must list layer counts >= 0 or -1"),
    ({"training": "yes"}, "training must be true or false"),
    ({"inference_execution": "phased"}, "inference_execution 'phased' is not one of sharded, pipelined"),
])
def test_bad_values_are_rejected(settings: dict, message: str) -> None:
    with pytest.raises(IPUError, match=message):
        IPUConfig.from_dict(settings)


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
    TRAINING.to_options_file(path, "title")
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
    TRAINING.to_options_file(path, "title")
    assert "Training.gradientAccumulation(9)" in path.read_text()
    with pytest.raises(IPUError, match="poptorch is required .* ships only with Graphcore's Poplar SDK"):
        TRAINING.to_poptorch_options()
