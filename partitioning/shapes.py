"""Model configs to plan for: a family's named shape (its recipe's ``[shapes]``) or a HuggingFace config file.

Only the shape matters for costing (the weights are never loaded), so a named
shape is the config keyword arguments of a released checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from partitioning.blocks import import_class
from partitioning.plan import PlanError


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


def config_class(path: str) -> type:
    """The config class ``package.Name`` (imported late: the partitioner itself does not need transformers)."""
    module, _, name = path.rpartition(".")
    return import_class(module, name)


def make_config(path: str, kwargs: Mapping[str, Any]) -> Any:
    """A ``path`` config (e.g. ``transformers.T5Config``) from keyword arguments."""
    cls = config_class(path)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise PlanError(f"bad {cls.__name__}: {exc}") from None


def unknown_keys(path: str, kwargs: Mapping[str, Any]) -> list[str]:
    """Keys a config class does not know (HF configs keep any keyword as an attribute, so a typo is silent)."""
    default = config_class(path)()
    return [key for key in kwargs if not hasattr(default, key)]
