"""Model configs to plan for: a family's named shape (its recipe's ``[shapes]``) or a HuggingFace config file.

Only the shape matters for costing (the weights are never loaded), so a named
shape is the config keyword arguments of a released checkpoint.  A config file
is the user's: it is read capped, and checked against the config class before
the model is built (a config of another model type, a value of the wrong type,
a size that is not positive), so a careless file is one line, not a traceback
from deep inside the model's constructor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from common.errors import UserError
from common.files import read_json_object
from families.models import import_class

MAX_CONFIG_BYTES = 1 << 20


def config_file_kwargs(path: Path) -> dict[str, Any]:
    """The keyword arguments stored in a HuggingFace ``config.json``."""
    return read_json_object(path, "config", MAX_CONFIG_BYTES)


def config_class(path: str) -> type:
    """The config class ``package.Name`` (imported late: the partitioner itself does not need transformers)."""
    module, _, name = path.rpartition(".")
    return import_class(module, name)


def check_config_values(path: str, kwargs: Mapping[str, Any], sizes: Iterable[str] = (), where: str = "config"
                        ) -> None:
    """Values a ``path`` config takes: its model type, the type of each value it has a default for, ``sizes`` > 0."""
    cls = config_class(path)
    expected = getattr(cls, "model_type", None)
    given = kwargs.get("model_type")
    if expected and given is not None and given != expected:
        raise UserError(f"{where} is a {given!r} config (model_type), not {expected!r}: give a {cls.__name__} "
                        f"config.json")
    default = cls()
    for key, value in kwargs.items():
        reference = getattr(default, key, None)
        if isinstance(reference, bool):
            ok, kind = isinstance(value, bool), "true or false"
        elif isinstance(reference, int):
            ok, kind = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif isinstance(reference, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            kind = "a finite number"
        elif isinstance(reference, str):
            ok, kind = isinstance(value, str), "a string"
        else:
            continue  # no default to go by (None, lists, dicts): the config class decides
        if not ok:
            raise UserError(f"{where}: {key} must be {kind}, got {value!r:.40}")
    check_rope_fields(kwargs, where)
    for key in sizes:  # a token id every shape sets (GPT-2's pad id) may be 0, as BERT's pad id is
        value, least = kwargs.get(key), 0 if key in TOKEN_IDS else 1
        if key in kwargs and not (isinstance(value, int) and not isinstance(value, bool) and value >= least):
            kind = "a non-negative integer (a token id)" if least == 0 else "a positive integer"
            raise UserError(f"{where}: {key} must be {kind}, got {value!r:.40}")


def make_config(path: str, kwargs: Mapping[str, Any]) -> Any:
    """A ``path`` config (e.g. ``transformers.T5Config``) from keyword arguments."""
    cls = config_class(path)
    try:
        return cls(**kwargs)
    except Exception as exc:  # noqa: BLE001 (a config's __init__ may raise anything: a read-only property, a bad enum)
        detail = " ".join(str(exc).split())[:200]
        raise UserError(f"bad {cls.__name__}: {type(exc).__name__}: {detail}") from None


# Rotary scalings whose frequencies are computed once, when the model is built, and the keys each needs (a
# traced stage can run nothing else).  "dynamic" and "longrope" recompute them in the forward from the largest
# position of each batch: control flow on the data, which no trace (fx, export, pipeline stages) can follow.
STATIC_ROPE = {"default": (), "linear": ("factor",), "yarn": ("factor",),
               "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
RUNTIME_ROPE = ("dynamic", "longrope")


def check_rope_fields(kwargs: Mapping[str, Any], where: str = "config") -> None:
    """The rotary scaling of a config's keyword arguments, if it has one (:func:`check_rope`)."""
    for key in ("rope_scaling", "rope_parameters"):  # 5.x names it rope_parameters
        if kwargs.get(key) is not None:
            check_rope(kwargs[key], f"{where}: {key}")


def check_rope(value: Any, where: str) -> None:
    """A rotary scaling the generated models can trace: a static type, with its keys, factors numbers >= 1."""
    if not isinstance(value, dict):
        raise UserError(f"{where} must be an object (rope_type, factor, ...), got {value!r:.40}")
    if value and "rope_type" not in value and "type" not in value and all(isinstance(v, dict) for v in value.values()):
        for layer_type, each in value.items():  # one per attention type (5.x Gemma 3: sliding, full)
            check_rope(each, f"{where}.{layer_type}")
        return
    kind = value.get("rope_type", value.get("type"))
    if kind in RUNTIME_ROPE:
        raise UserError(f"{where}: rope_type {kind!r} recomputes the rotary frequencies from each batch's positions "
                        f"as the model runs, which a traced pipeline stage cannot (a static type: "
                        f"{', '.join(STATIC_ROPE)})")
    if kind not in STATIC_ROPE:
        raise UserError(f"{where}: unknown rope_type {kind!r} (known: {', '.join(STATIC_ROPE)})")
    for key in STATIC_ROPE[kind]:
        if key not in value:
            raise UserError(f"{where}: rope_type {kind!r} needs {key}")
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        number = value.get(key)
        if key in value and (isinstance(number, bool) or not isinstance(number, (int, float))
                             or not math.isfinite(number) or number < 1):
            raise UserError(f"{where}: {key} must be a number >= 1, got {number!r:.40}")


# Special token ids: every config had them (None by default) until transformers 5.0, whose configs
# default only those their model declares; a model may still read another one (5.x T5 shifts labels
# right by config.decoder_start_token_id), so setting one is no typo.
TOKEN_IDS = frozenset({"pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id"})


def shape_kwargs(definition: Any, shape: str, release: str) -> tuple[dict[str, Any], list[str]]:
    """A named shape's config keywords for ``release`` and the keys its config class does not know.

    Keys a ``[[shapes.absent]]`` entry of the recipe covers for ``release`` are left out, each checked
    against what that release's model does instead (a ``UserError`` if the shape disagrees).
    """
    kwargs, config = definition.shapes[shape], definition.config_class
    kept, left = dict(kwargs), []
    for key in unknown_keys(definition.config_path, kwargs):
        entry = next((e for e in definition.absent_keys
                      if e.covers(release) and (key in e.equal or key in e.quotient or key in e.period)), None)
        if entry is None:
            left.append(key)
            continue
        if key in entry.period:
            period_key, item = entry.period[key]
            kept[period_key] = _period(shape, key, kwargs[key], item, f"the {config} of release {release}")
            expected, how = kwargs[key], ""
        elif key in entry.equal:
            expected, how = entry.equal[key], "acts as"
        else:
            numerator, denominator = entry.quotient[key]
            expected, how = kwargs[numerator] // kwargs[denominator], f"derives {numerator} // {denominator} ="
        if kwargs[key] != expected:
            raise UserError(f"shape {shape} sets {key} = {kwargs[key]!r}, but the {config} of release {release} has "
                            f"no {key} and its model {how} {expected!r}")
        del kept[key]
    return kept, left


def _period(shape: str, key: str, items: list[Any], item: str, config: str) -> int:
    """The period k that makes ``item`` exactly the items at positions k-1, 2k-1, ...; a ``UserError`` if none does."""
    marked = [i for i, value in enumerate(items) if value == item]
    period = marked[0] + 1 if marked else len(items) + 1
    if [(i + 1) % period == 0 for i in range(len(items))] != [value == item for value in items]:
        raise UserError(f"shape {shape} sets {key} = {items!r}, but {config} has no {key}: it places "
                        f"{item!r} every k-th layer, and no k gives this list")
    return period


def unknown_keys(path: str, kwargs: Mapping[str, Any]) -> list[str]:
    """Keys a config class does not know (HF configs keep any keyword as an attribute, so a typo is silent)."""
    default = config_class(path)()
    return [key for key in kwargs if not hasattr(default, key) and key not in TOKEN_IDS]
