"""Annotate a live model for PopTorch from a placement, and remove the annotations again."""

from __future__ import annotations

from typing import Any

import torch

from partitioning.ipu.errors import IPUError, require_poptorch
from partitioning.ipu.placement import Placement
from stateless.torch_internals import forward_hooks


class RecomputeCheckpoint:
    """Forward hook marking a module's tensor outputs as recomputation checkpoints (kept, not recomputed)."""

    def __init__(self, poptorch: Any) -> None:
        self.poptorch = poptorch

    def __call__(self, module: torch.nn.Module, inputs: Any, outputs: Any) -> Any:
        if isinstance(outputs, torch.Tensor):
            return self.poptorch.recomputationCheckpoint(outputs)
        if isinstance(outputs, tuple):  # T5 blocks also return None entries, which have nothing to keep
            return tuple(self.poptorch.recomputationCheckpoint(value) if isinstance(value, torch.Tensor) else value
                         for value in outputs)
        return outputs


class SerializedForward:
    """A projection's forward as ``factor`` matmuls over its output channels (optimum-graphcore's SerializedLinear).

    Installed as the module's own ``forward``: a stateless linear is called
    ``(weight, hidden_states)``, a ``torch.nn.Linear`` ``(hidden_states)``.
    """

    def __init__(self, module: torch.nn.Module, factor: int, poptorch: Any) -> None:
        self.module, self.factor, self.poptorch = module, factor, poptorch

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        module = self.module
        if getattr(module, "takes_shared_weight", False):
            weight, hidden = args
        else:
            (hidden,), own = args, module.weight
            assert isinstance(own, torch.Tensor), type(module)  # a torch.nn.Linear's own weight
            weight = own
        mode = self.poptorch.MatMulSerializationMode.OutputChannels
        output = self.poptorch.serializedMatMul(hidden, weight.t(), mode, self.factor)
        return output if module.bias is None else output + module.bias


def _submodule(model: torch.nn.Module, name: str, placement: Placement) -> torch.nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError:
        roles = placement.roles
        fix = f"this placement is for the {roles.form} form: {roles.hint}" if roles else "re-plan for this model"
        raise IPUError(f"the model has no module {name}: {fix}") from None


def check_model(model: torch.nn.Module, placement: Placement) -> None:
    """The model is the one the placement was made for: every module exists, in the expected form."""
    roles = placement.roles
    if roles is not None and roles.marker is not None and roles.marker not in dict(model.named_parameters()):
        raise IPUError(f"this placement is for the {roles.form} form of the model: {roles.hint}")
    names = {name for name, _ in model.named_modules(remove_duplicate=False)}
    for unit in placement.units:
        module = _submodule(model, unit.module, placement)
        if unit.call != unit.module and unit.call in names:
            # The placement counts on the call running ``unit.module``; a different object would escape its hook.
            if model.get_submodule(unit.call) is not module:
                raise IPUError(f"{unit.call} is not the module {unit.module} in this model, as the placement "
                               f"assumes: re-plan for this model's form")
    objects: dict[int, str] = {}
    for annotation in placement.annotations:
        key = id(model.get_submodule(annotation.module))
        if key in objects:
            raise IPUError(f"{annotation.module} and {objects[key]} are one module in this model, which PopTorch "
                           f"can annotate once: re-plan for this model's form")
        objects[key] = annotation.module


def parallelize(model: torch.nn.Module, placement: Placement) -> torch.nn.Module:
    """Wrap each block start in ``poptorch.BeginBlock`` (in execution order), add recomputation checkpoints and
    serialize the vocabulary projection."""
    poptorch = require_poptorch()
    check_model(model, placement)
    for annotation in placement.annotations:
        poptorch.BeginBlock(model.get_submodule(annotation.module), annotation.user_id, ipu_id=annotation.ipu)
    for name in placement.recompute:
        model.get_submodule(name).register_forward_hook(RecomputeCheckpoint(poptorch))
    if placement.serialized is not None:
        module = model.get_submodule(placement.serialized)
        module.forward = SerializedForward(module, placement.config.embedding_serialization_factor, poptorch)
    return model


def deparallelize(model: torch.nn.Module) -> torch.nn.Module:
    """Remove every BeginBlock (``poptorch.removeBlocks``), checkpoint hook and serialization :func:`parallelize`
    added."""
    require_poptorch().removeBlocks(model)
    for module in model.modules():
        for key in [key for key, hook in forward_hooks(module).items() if isinstance(hook, RecomputeCheckpoint)]:
            del forward_hooks(module)[key]
        if isinstance(module.__dict__.get("forward"), SerializedForward):
            del module.forward
    return model
