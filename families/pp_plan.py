"""Reading a family's block chain and tied weights off the source's own pipeline plan, not restating them.

Transformers' decoder-only LLMs declare how torch pipelining may split them: the config class's
``base_model_pp_plan`` (the base model's modules in execution order: ``embed_tokens``, ``layers``,
``norm``) and each task class's ``_pp_plan`` (modules of the class itself: ``lm_head``); their
``_tied_weights_keys`` say which weight is the input embedding's (a list of keys tied to the input
embeddings in 4.x, a ``{key: source key}`` dict in 5.x).  A recipe saying ``[pipeline] chain =
"pp_plan"`` gets its chain from here (:func:`read_chain`), and its ``shared_weight`` step's tied
linears are checked against the tied keys (:func:`check_tied`).  Nothing here names a family.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from torch import nn

from common.errors import UserError
from families.definition import ChainEntry, ClassInfo, SharedWeight
from families.sections import PlanEntry

PP_PLAN = "pp_plan"  # the recipe's [pipeline] chain value


def _names(plan: Any, owner: str) -> tuple[str, ...]:
    if plan is None:
        return ()
    if not isinstance(plan, Mapping) or not all(isinstance(name, str) for name in plan):
        raise UserError(f"{owner} is not a pipeline plan (a mapping of module names): {plan!r:.80}")
    return tuple(plan)


def read_chain(config_class: type, classes: Mapping[str, type], model: nn.Module, base: str,
               sublayers: Sequence[tuple[str, ...]] = (), stand_in: PlanEntry | None = None
               ) -> tuple[ChainEntry, ...]:
    """The chain: ``config_class.base_model_pp_plan`` (paths in the base model), then every class's ``_pp_plan``.

    ``model`` is one of the classes built (on meta), its base model at ``base``: a plan entry that is a
    ``ModuleList`` there becomes a layer list (one block per item, with ``sublayers``), any other a block
    of that one module.  Class entries are the union over ``classes`` in their order (a block applies to
    a class that has its module).  ``stand_in``: the recipe's plan for a release whose classes declare
    none (``[[pipeline.plans]]``); a release declaring its own is read, and the recipe's range corrected.
    """
    owner = f"{config_class.__name__}.base_model_pp_plan"
    names = _names(getattr(config_class, "base_model_pp_plan", None), owner)
    if names and stand_in is not None:
        raise UserError(f"{config_class.__module__}.{config_class.__name__} declares a base_model_pp_plan: the "
                        f"recipe's [[pipeline.plans]] for {stand_in.versions!r} must not cover this release")
    if stand_in is not None:
        names, owner = stand_in.base, f"the recipe's [[pipeline.plans]] for {stand_in.versions!r}"
    if not names:
        raise UserError(f"{config_class.__module__}.{config_class.__name__} declares no base_model_pp_plan: "
                        f"the recipe's [pipeline] chain = \"{PP_PLAN}\" has nothing to read (list [[pipeline.blocks]], "
                        f"or [[pipeline.plans]] for this release)")
    chain = []
    for name in names:
        path = f"{base}.{name}" if base else name
        try:
            module = model.get_submodule(path)
        except AttributeError:
            raise UserError(f"{owner} names {name!r}, which {type(model).__name__} has not at {path}") from None
        chain.append(ChainEntry(layers=name, sublayers=tuple(sublayers)) if isinstance(module, nn.ModuleList)
                     else ChainEntry(name=name, modules=(name,)))
    heads = [(name,) for name in stand_in.heads] if stand_in is not None else [
        _names(getattr(cls, "_pp_plan", None), f"{class_name}._pp_plan") for class_name, cls in classes.items()]
    for declared in heads:
        for name in declared:
            if not any(entry.root and entry.name == name for entry in chain):
                chain.append(ChainEntry(name=name, modules=(name,), root=True))
    return tuple(chain)


def tied_keys(cls: type, model: nn.Module | None = None) -> dict[str, str]:
    """``{tied parameter: the parameter it is}`` of ``cls._tied_weights_keys``.

    A 4.x list names keys tied to the input embeddings: ``model`` (a built ``cls``) says which
    parameter that is.
    """
    keys = getattr(cls, "_tied_weights_keys", None)
    if not keys:
        return {}
    if isinstance(keys, Mapping):
        return {str(key): str(value) for key, value in keys.items()}
    if model is None:
        raise UserError(f"{cls.__name__}._tied_weights_keys is a list: the model is needed to find its input "
                        f"embeddings")
    embedding = cast(Callable[[], nn.Module], model.get_input_embeddings)()  # a PreTrainedModel's
    source = next((f"{name}.weight" for name, module in model.named_modules() if module is embedding), None)
    if source is None:
        raise UserError(f"{cls.__name__}: its input embeddings are no submodule")
    return {str(key): source for key in keys}


def check_tied(origin: str, info: ClassInfo, weights: Sequence[SharedWeight], tied: Mapping[str, str]) -> None:
    """The recipe's ``shared_weight`` step ties what the source's ``_tied_weights_keys`` does, no more, no less."""
    declared = {f"{weight.tied_linear}.weight": f"{weight.module}.weight"
                for weight in weights if weight.tied_linear is not None}
    if declared != dict(tied):
        raise UserError(f"recipe {origin}: the shared_weight step ties {declared or 'nothing'} in {info.name}, but "
                        f"its _tied_weights_keys say {dict(tied) or 'nothing'}")
