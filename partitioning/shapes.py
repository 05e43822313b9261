"""Model sizes to plan for: the published T5 checkpoints' hyper-parameters, or a config file.

Only the shape matters for costing (the weights are never loaded), so a named
shape is the ``T5Config`` keyword arguments of the released checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from partitioning.plan import PlanError

# From the config.json files published with the original T5 checkpoints (v1.0: relu feed-forward,
# tied embeddings, 32128-token vocabulary, 32 relative-position buckets).
_COMMON: dict[str, Any] = {"vocab_size": 32128, "feed_forward_proj": "relu", "relative_attention_num_buckets": 32,
                           "dropout_rate": 0.1, "layer_norm_epsilon": 1e-6, "tie_word_embeddings": True,
                           "decoder_start_token_id": 0, "pad_token_id": 0}
SHAPES: dict[str, dict[str, Any]] = {
    "t5-small": {**_COMMON, "d_model": 512, "d_ff": 2048, "d_kv": 64, "num_heads": 8, "num_layers": 6},
    "t5-base": {**_COMMON, "d_model": 768, "d_ff": 3072, "d_kv": 64, "num_heads": 12, "num_layers": 12},
    "t5-large": {**_COMMON, "d_model": 1024, "d_ff": 4096, "d_kv": 64, "num_heads": 16, "num_layers": 24},
    "t5-3b": {**_COMMON, "d_model": 1024, "d_ff": 16384, "d_kv": 128, "num_heads": 32, "num_layers": 24},
    "t5-11b": {**_COMMON, "d_model": 1024, "d_ff": 65536, "d_kv": 128, "num_heads": 128, "num_layers": 24},
}


def shape_kwargs(name: str) -> dict[str, Any]:
    try:
        return dict(SHAPES[name])
    except KeyError:
        raise PlanError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}") from None


def config_file_kwargs(path: Path) -> dict[str, Any]:
    """The keyword arguments stored in a HuggingFace ``config.json``."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise PlanError(f"cannot read config {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise PlanError(f"config {path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PlanError(f"config {path} is not a JSON object")
    return data


def t5_config(shape: str | None = None, config_file: Path | None = None) -> Any:
    """A ``T5Config`` for a named shape or a config file (exactly one of them)."""
    if (shape is None) == (config_file is None):
        raise PlanError("give exactly one of a shape name or a config file")
    from transformers import T5Config  # imported late: the partitioner itself does not need it

    kwargs = shape_kwargs(shape) if shape is not None else config_file_kwargs(config_file)  # type: ignore[arg-type]
    try:
        config = T5Config(**kwargs)
    except (TypeError, ValueError) as exc:
        raise PlanError(f"bad T5 config: {exc}") from None
    if config.feed_forward_proj not in ("relu", "gated-gelu"):
        raise PlanError(f"bad T5 config: feed_forward_proj {config.feed_forward_proj!r} is not relu or gated-gelu")
    return config
