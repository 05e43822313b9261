"""Gemma 3's family definition: its named shapes are the published configs, and partition-model plans them.

Run as a user runs it: in a process whose transformers is 5.23.0 (PYTHONPATH), on meta tensors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import load_script
from support import REPO

from families.registry import definitions

installer = load_script("install_releases")
RELEASE = "5.23.0"
# The published configs say sliding_window_pattern 6; the shapes write the layer_types it expands to.
EXPANDS = """
import json, sys
from transformers import Gemma3TextConfig
shapes = json.loads(sys.argv[1])
print(json.dumps({name: Gemma3TextConfig(num_hidden_layers=len(types), sliding_window_pattern=6).layer_types == types
                  for name, types in shapes.items()}))
"""


def environment() -> dict[str, str]:
    assert installer.is_installed({r.version: r for r in installer.read_releases()}[RELEASE]), (
        f"no stock install of transformers {RELEASE}: bash scripts/setup.sh")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(installer.install_dir(RELEASE)), str(REPO)])}


def test_gemma3_shapes_are_the_published_layer_patterns() -> None:
    definition = definitions()["gemma3"]
    assert definition.chain_from == "pp_plan"
    assert set(definition.shapes) == {"gemma-3-1b", "gemma-3-4b", "tiny"}
    published = {name: definition.shapes[name]["layer_types"] for name in ("gemma-3-1b", "gemma-3-4b")}
    result = subprocess.run([sys.executable, "-c", EXPANDS, json.dumps(published)], env=environment(),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == {"gemma-3-1b": True, "gemma-3-4b": True}


def test_partition_model_plans_gemma_3_1b_by_sublayer(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "partitioning.cli", "gemma3", "--version", RELEASE, "--stages", "4",
                             "--shape", "gemma-3-1b", "--granularity", "sublayer", "--output", "plan.json"],
                            cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "embed_tokens .. " in out and ".. lm_head" in out
    # Gemma's sub-layers: the attention with both its norms, the MLP with both of its.
    assert ".input_layernorm .. " in out and ".pre_feedforward_layernorm" in out
    # Both masks (full and sliding) and both rotary tables (local and global: cos and sin each) are recomputed.
    assert out.count("recomputed, not sent: model:float32[8, 1, 2048, 2048]") == 2, out
    assert out.count("recomputed, not sent: model.rotary_emb:float32[1, 2048, 256]") == 4, out
    assert (tmp_path / "plan.json").is_file()
