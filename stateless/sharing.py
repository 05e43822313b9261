"""Turn a model's shared weight into one top-level parameter, and back.

Generated models call these from their ``make_stateless``/``make_stateful``
methods with recipe data (which module holds the shared weight, which modules
use it).  The stateless form keeps exactly one ``nn.Parameter`` (the same
object, so optimizer state survives) and every former user becomes a stateless
layer that receives it as its first forward argument.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from stateless.checks import is_None
from stateless.layers import StatelessEmbedding, StatelessLinear
from stateless.torch_internals import own_children, own_parameters, register_load_state_dict_pre_hook, set_own_children


@dataclass(frozen=True)
class SharedWeightSpec:
    shared: str  # the attribute holding the shared nn.Embedding in the stateful form
    weight: str  # the top-level parameter in the stateless form
    users: tuple[str, ...]  # submodules that are the shared embedding, or tie its weight, in the stateful form
    tied_linear: str | None  # a Linear whose weight is the same parameter (tied LM head)
    hf_keys: tuple[str, ...]  # the state-dict keys the stateful form stores the weight under
    module_order: tuple[str, ...]  # the owner's submodule order, restored by make_stateful
    # Users that were embeddings of their own tying the weight (transformers 5.x), not the holder itself.
    own_modules: tuple[str, ...] = ()


_SETTINGS = ("num_embeddings", "embedding_dim", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq",
             "sparse")


def _spec(model: nn.Module) -> SharedWeightSpec | None:
    return model.__dict__.get("_shared_weight_spec")


def is_stateless(model: nn.Module) -> bool:
    return _spec(model) is not None


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)


def make_stateless(model: nn.Module, *, shared: str, weight: str, users: Sequence[str],
                   tied_linear: str | None = None) -> nn.Module:
    """Give ``model`` its stateless form; a no-op when it already has it."""
    if is_stateless(model):
        return model
    embedding = model.get_submodule(shared)
    if not isinstance(embedding, nn.Embedding):
        raise TypeError(f"make_stateless: {shared} is a {type(embedding).__name__}, not an nn.Embedding")
    parameter = embedding.weight
    own_modules = []
    for name in users:
        user = model.get_submodule(name)
        if user is embedding:
            continue
        # An embedding of its own tying the weight (HF 5.x ties parameters, not modules) embeds the same
        # way only with the same settings: then one stateless layer like the holder's replaces it.
        if not isinstance(user, nn.Embedding) or user.weight is not parameter:
            raise ValueError(f"make_stateless: {name} is not the shared embedding {shared} and does not tie its weight")
        if any(getattr(user, key) != getattr(embedding, key) for key in _SETTINGS):
            raise ValueError(f"make_stateless: {name} ties {shared}'s weight but embeds with other settings")
        own_modules.append(name)
    keys = [shared + ".weight", *(name + ".weight" for name in users)]
    if tied_linear is not None:
        linear = model.get_submodule(tied_linear)
        if not isinstance(linear, nn.Linear) or linear.weight is not parameter:
            raise ValueError(f"make_stateless: {tied_linear} does not share {shared}'s weight")
        _set_submodule(model, tied_linear, StatelessLinear.like(linear))
        keys.append(tied_linear + ".weight")
    owner_name, _, attribute = shared.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    order = tuple(own_children(owner))
    if shared not in users:  # the holder is only registered under its own name (T5's shared): it goes
        delattr(owner, attribute)
    for name in users:  # a holder that is also a user (GPT-2's wte) is replaced in place
        _set_submodule(model, name, StatelessEmbedding.like(embedding))
    model.register_parameter(weight, parameter)
    spec = SharedWeightSpec(shared, weight, tuple(users), tied_linear, tuple(dict.fromkeys(keys)), order,
                            tuple(own_modules))
    model.__dict__["_shared_weight_spec"] = spec
    # load_state_dict of a stock (HF-keyed) checkpoint keeps working.
    model.__dict__["_shared_weight_hook"] = register_load_state_dict_pre_hook(model, _LoadHFKeys(spec))
    if callable(getattr(type(model), "save_pretrained", None)):  # shadows the class's, until make_stateful
        model.__dict__["save_pretrained"] = _SaveStock(model)
    return model


class _SaveStock:
    """``save_pretrained`` of a stateless model: the stock checkpoint (HF keys, :func:`stateful_state_dict`).

    The class's own would save ``state_dict()``, which holds the shared weight under the stateless form's
    name only: ``from_pretrained`` then finds no embedding and initializes it anew, with only a log line.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        save = type(self.model).save_pretrained.__get__(self.model)
        try:
            bound = inspect.signature(save).bind(*args, **kwargs)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"save_pretrained: {exc}") from None
        if "state_dict" not in inspect.signature(save).parameters:
            raise ValueError("save_pretrained of a stateless model cannot be given the stock state dict here: "
                             "call make_stateful() first, or save stateful_state_dict(model) yourself")
        if bound.arguments.get("state_dict") is None:
            bound.arguments["state_dict"] = stateful_state_dict(self.model)
        return save(*bound.args, **bound.kwargs)


@dataclass(frozen=True)
class _LoadHFKeys:
    """load_state_dict pre-hook: HF's keys for the shared weight load into the top-level parameter.

    A module-level class, not a closure, so that a stateless model pickles (``torch.save(model)``).
    """

    spec: SharedWeightSpec

    def __call__(self, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
        found = [prefix + key for key in self.spec.hf_keys if prefix + key in state_dict]
        # The stateful model holds one tensor under all these keys, so loading keeps whichever comes last; copies
        # that differ are a checkpoint of another (untied) model, which must not load silently as this one.
        real = [(key, state_dict[key]) for key in found
                if isinstance(state_dict[key], torch.Tensor) and state_dict[key].device.type != "meta"]
        for key, value in real[1:]:
            first, reference = real[0]
            if value.shape != reference.shape or not torch.equal(value, reference):
                raise ValueError(f"the checkpoint's {first} and {key} differ, but this model ties them into "
                                 f"{self.spec.weight}: it is a checkpoint of an untied model")
        if found and prefix + self.spec.weight not in state_dict:
            state_dict[prefix + self.spec.weight] = state_dict[found[0]]
        for key in found:
            del state_dict[key]


def make_stateful(model: nn.Module) -> nn.Module:
    """Undo :func:`make_stateless`; a no-op on a stateful model."""
    spec = _spec(model)
    if spec is None:
        return model
    parameter = getattr(model, spec.weight)
    embedding = model.get_submodule(spec.users[0]).to_embedding(parameter) if spec.users else None
    if embedding is None:
        raise ValueError("make_stateful: the stateless form records no embedding user")
    if spec.tied_linear is not None:
        _set_submodule(model, spec.tied_linear, model.get_submodule(spec.tied_linear).to_linear(parameter))
    del own_parameters(model)[spec.weight]
    _set_submodule(model, spec.shared, embedding)
    for name in spec.users:
        own = name in spec.own_modules
        _set_submodule(model, name, model.get_submodule(name).to_embedding(parameter) if own else embedding)
    owner_name = spec.shared.rpartition(".")[0]
    owner = model.get_submodule(owner_name) if owner_name else model
    children = own_children(owner)
    set_own_children(owner, {name: children[name] for name in spec.module_order if name in children} | {
        name: module for name, module in children.items() if name not in spec.module_order})
    model.__dict__.pop("_shared_weight_hook").remove()
    model.__dict__.pop("save_pretrained", None)
    del model.__dict__["_shared_weight_spec"]
    return model


def shared_weight(model: nn.Module, shared: str, weight: str,
                  passed: torch.Tensor | None = None) -> torch.Tensor | None:
    """What the generated forward passes on to the users of the shared weight.

    ``passed``: the weight a caller handed down (a model called by another model, GPT-2's
    ``transformer`` inside the LM head model); when given, it is the weight.  Otherwise the
    top-level parameter in the stateless form, and ``None`` in the stateful form, where every
    user owns the weight and :func:`call_shared` does not pass it: a tracer that wraps only the
    values its parent passes (FTPipe's) refuses a parameter read out of a leaf module as an
    untraced tensor constant.
    """
    if not is_None(passed):
        return passed
    if is_stateless(model):
        return getattr(model, weight)
    if getattr(model.get_submodule(shared), "takes_shared_weight", False):
        raise ValueError(f"{type(model).__name__}: {shared} is stateless here; call the model that owns the "
                         f"shared weight, or pass it")
    return None


def call_shared(module: nn.Module, weight: torch.Tensor | None, *inputs: Any) -> Any:
    """Call a (possibly) stateless user of the shared weight: stateless layers take it first.

    Dispatches on the layer's ``takes_shared_weight`` attribute, not on its
    class: a tracer may hand over a wrapper that forwards attribute lookups to
    the layer but is not an instance of it.
    """
    if getattr(module, "takes_shared_weight", False):
        return module(weight, *inputs)
    return module(*inputs)


def stateful_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of the stateful form (stock HF keys), without changing ``model``."""
    state = model.state_dict()
    spec = _spec(model)
    if spec is None:
        return state
    value = state.pop(spec.weight)
    return {**{key: value for key in spec.hf_keys}, **state}
