"""The plan's model on ``meta``, the stock checkpoint keys of each of its tensors, and the check of a checkpoint.

Every rank builds the whole model with its parameters on ``meta`` (no memory,
no initialisation): registering a parameter moves it there at once.  Buffers
(position ids, causal masks) are small and computed in ``__init__``: they are
kept as built, the values a checkpoint without them leaves in place, then
moved to ``meta`` for tracing.  The generated model's stateful form has the
stock module layout, so its state-dict keys are the checkpoint's; its
stateless form (what the pipeline splits) keeps the same ``Parameter``
objects under other names, which is how each stateless name finds its keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from common.errors import UserError
from common.memory import release_freed_memory
from families.checkpoint import CONFIG, Checkpoint, describe_shape
from families.family import ModelFamily
from families.models import SharedWeight
from families.shapes import check_rope_fields, make_config
from stateless.torch_internals import own_buffers, own_parameters


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside goes to ``meta`` as it is registered (initialisers then touch nothing)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            own_parameters(module)[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


@dataclass
class MetaModel:
    """The stateless model on ``meta`` and what ties its names to a stock checkpoint."""

    model: nn.Module
    keys: dict[str, tuple[str, ...]]  # stateless parameter or buffer name -> its stock state-dict keys
    order: list[str]  # stateless parameter names in the stock model's parameters() order (one per parameter)
    buffers: dict[str, torch.Tensor]  # stateless buffer name -> its value as built
    state_keys: list[str]  # the stock state dict's keys, in order (what save_pretrained writes)
    ignore_missing: tuple[str, ...]
    ignore_unexpected: tuple[str, ...]

    def stock_name(self, name: str) -> str:
        return self.keys[name][0]


def build_meta(family: ModelFamily, class_name: str, config: Any) -> MetaModel:
    model_class = family.model_class(class_name)
    try:
        with parameters_on_meta(), torch.device("cpu"):
            model = model_class(config).train()
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 (a config the model's code rejects)
        raise UserError(f"cannot build {class_name} from the plan's config: {type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:200]}") from None
    stock: dict[int, list[str]] = {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        stock.setdefault(id(tensor), []).append(name)
    stock_order = [id(p) for p in model.parameters()]
    state_keys = list(model.state_dict(keep_vars=True))
    if isinstance(model, SharedWeight):
        model.make_stateless()
    named = dict(model.named_parameters(remove_duplicate=False))
    keys = {name: tuple(stock[id(p)]) for name, p in named.items()}
    first_name = {id(p): name for name, p in reversed(list(named.items()))}
    buffers = {}
    for module_name, module in model.named_modules(remove_duplicate=False):
        for leaf, buffer in list(own_buffers(module).items()):
            if buffer is None:
                continue
            name = f"{module_name}.{leaf}" if module_name else leaf
            keys[name] = tuple(stock[id(buffer)])
            buffers[name] = buffer
    for module in model.modules():
        for leaf, buffer in list(own_buffers(module).items()):
            if buffer is not None and buffer.device.type != "meta":
                own_buffers(module)[leaf] = buffer.to("meta")
    release_freed_memory()
    return MetaModel(model, keys, [first_name[i] for i in stock_order], buffers, state_keys,
                     tuple(getattr(model_class, "_keys_to_ignore_on_load_missing", None) or ()),
                     tuple(getattr(model_class, "_keys_to_ignore_on_load_unexpected", None) or ()))


# Config fields that describe the file or the library, not the model trained: never compared.
FILE_FIELDS = frozenset({"architectures", "transformers_version", "_name_or_path", "name_or_path", "torch_dtype",
                         "dtype", "_commit_hash", "_attn_implementation_autoset", "use_cache"})
# Fields that decide which weights the plan's stages hold (a tied plan splits one weight over its stages): as the
# sizes, they must match; no flag takes them from the checkpoint.
STRUCTURE_FIELDS = ("tie_word_embeddings", "tie_encoder_decoder")


def checkpoint_config(config: Any, checkpoint: Checkpoint, family: ModelFamily, class_name: str,
                      from_checkpoint: bool = False) -> tuple[Any, list[str]]:
    """The config to train: the checkpoint's.  It is compared with the plan's ``config`` field by field: family,
    class, every size and :data:`STRUCTURE_FIELDS` must match; any other difference (dropout, eps, rope, token
    ids, activation) is refused in one line naming each field, or with ``from_checkpoint`` taken from the
    checkpoint.  Also returns each field taken, described as ``name (checkpoint X; the plan Y)``."""
    where = f"checkpoint {checkpoint.directory}"
    theirs = checkpoint.config
    model_type = getattr(config, "model_type", None)
    if theirs.get("model_type") != model_type:
        raise UserError(f"{where} is a {theirs.get('model_type')!r} model, the plan a {model_type!r} one "
                        f"({family.name}): give a checkpoint of the planned model")
    architectures = theirs.get("architectures")
    if isinstance(architectures, list) and architectures and class_name not in architectures:
        raise UserError(f"{where} holds a {', '.join(map(str, architectures))}, the plan trains a {class_name}")
    path, replan = family.definition.config_path, f"re-plan with partition-model --config {checkpoint.directory / CONFIG}"
    check_rope_fields(theirs, f"{where}'s {CONFIG}")  # the rest: compared with the plan's below
    try:
        built = make_config(path, theirs)  # its defaults stand where the file (save_pretrained: a diff) has none
    except UserError as exc:
        raise UserError(f"{where}'s {CONFIG}: {exc}") from None
    ours, mine = config.to_dict(), built.to_dict()
    for size in [*family.sizes(), *STRUCTURE_FIELDS]:
        if size in ours and mine.get(size) != ours[size]:
            raise UserError(f"{where} has {size} = {mine.get(size)!r}, the plan {ours[size]!r}: {replan}")
    differing = sorted(key for key in set(ours) & set(mine) - FILE_FIELDS if ours[key] != mine[key])
    if not differing:
        return config, []
    fields = [f"{key} (checkpoint {mine[key]!r:.60}; the plan {ours[key]!r:.60})" for key in differing]
    if not from_checkpoint:
        raise UserError(f"{where}'s config differs from the plan's in {', '.join(fields)}: {replan}, or train the "
                        f"checkpoint's values with --config-from-checkpoint")
    return make_config(path, {**ours, **{key: mine[key] for key in differing}}), fields


def check_checkpoint(meta: MetaModel, checkpoint: Checkpoint, family: ModelFamily, class_name: str,
                     config: Any) -> None:
    """The checkpoint is of the plan's model (its config that of ``config``, :func:`checkpoint_config`) and holds
    every tensor with its shape."""
    checkpoint_config(config, checkpoint, family, class_name)
    where = f"checkpoint {checkpoint.directory}"
    shapes = checkpoint.shapes
    parameters = dict(meta.model.named_parameters(remove_duplicate=False))
    for name, keys in meta.keys.items():
        expected = tuple((parameters[name] if name in parameters else meta.buffers[name]).shape)
        present = [key for key in keys if key in shapes]
        if not present and name in parameters:
            raise UserError(f"{where} lacks {keys[0]} (shape {describe_shape(expected)})")
        for key in present:
            if shapes[key] != expected:
                raise UserError(f"{where} has {key} of shape {describe_shape(shapes[key])}, the model "
                                f"{describe_shape(expected)}")
    known = {key for keys in meta.keys.values() for key in keys}
    unexpected = [key for key in shapes if key not in known
                  and not any(re.search(pattern, key) for pattern in meta.ignore_unexpected)]
    if unexpected:
        raise UserError(f"{where} has {unexpected[0]}, which a {class_name} of this config does not have"
                        f"{f' (and {len(unexpected) - 1} more)' if len(unexpected) > 1 else ''}")


def check_tied(meta: MetaModel, checkpoint: Checkpoint) -> None:
    """A weight the plan ties (one parameter under several stock keys) must not be in the file twice with different
    values: that is an untied model's, which stock ``from_pretrained`` would tie silently, dropping one of them."""
    parameters = dict(meta.model.named_parameters(remove_duplicate=False))
    seen: set[tuple[str, ...]] = set()
    for name, keys in meta.keys.items():
        present = tuple(key for key in keys if key in checkpoint.shapes)
        if name not in parameters or len(present) < 2 or present in seen:
            continue
        seen.add(present)
        values = checkpoint.load(present)
        other = next((key for key in present[1:] if not torch.equal(values[key], values[present[0]])), None)
        if other is not None:
            raise UserError(f"checkpoint {checkpoint.directory} holds {present[0]} and {other} with different "
                            f"values, which the plan ties: it is an untied model (re-plan from a config with "
                            f"tie_word_embeddings false)")


def source_key(meta: MetaModel, name: str, checkpoint: Checkpoint) -> str | None:
    """The checkpoint key a stateless tensor loads from (the first of its stock names present), else None (also for
    a constant torch.export lifted out of the forward into a stage, ``torch.tensor(-100)``: no state of the model)."""
    return next((key for key in meta.keys.get(name, ()) if key in checkpoint.shapes), None)


def materialize(module: nn.Module, meta: MetaModel, checkpoint: Checkpoint, device: torch.device, where: str,
                prefix: str = "") -> None:
    """Give every ``meta`` tensor of ``module`` (``meta.model`` or a part of it, its names under ``prefix``) its
    value: read from the checkpoint, else (a buffer the file lacks) the value built; a tensor shared under
    several names is read once and stays shared."""
    replaced: dict[int, torch.Tensor] = {}
    for owner_name, owner in module.named_modules(remove_duplicate=False):
        tables: tuple[dict[str, Any], ...] = (own_parameters(owner), own_buffers(owner))
        for table in tables:
            for leaf, tensor in list(table.items()):
                if tensor is None or tensor.device.type != "meta":
                    continue
                name = f"{owner_name}.{leaf}" if owner_name else leaf
                if id(tensor) not in replaced:
                    replaced[id(tensor)] = _value(meta, checkpoint, device, name.removeprefix(prefix), tensor, where)
                table[leaf] = replaced[id(tensor)]
    left = [name for name, t in [*module.named_parameters(), *module.named_buffers()] if t.device.type == "meta"]
    if left:
        raise UserError(f"{where}: {left[0]} has no value to load")


def _value(meta: MetaModel, checkpoint: Checkpoint, device: torch.device, name: str, like: torch.Tensor,
           where: str) -> torch.Tensor:
    if name not in meta.keys:
        raise UserError(f"{where} holds {name}, which the model does not name")
    key = source_key(meta, name, checkpoint)
    if key is not None:
        value = checkpoint.load([key])[key]
    elif name in meta.buffers:
        value = meta.buffers[name].clone()
    else:
        raise UserError(f"checkpoint {checkpoint.directory} lacks {meta.keys[name][0]}")
    value = value.to(device=device, dtype=like.dtype)
    return nn.Parameter(value, requires_grad=like.requires_grad) if isinstance(like, nn.Parameter) else value
