"""The one place the project reaches torch's private names (torch 2.13.0 through 2.14.1).

Every name here is torch's own and not part of its documented API: a module attribute, class or
function starting with ``_``, or one of ``torch.distributed.pipelining``'s private modules
(``_IR``, ``_backward``, ``schedules._...``).  The rest of the tree calls these functions instead,
so a torch release that renames or reshapes one fails in this file, and in
``tests/stateless/test_torch_internals.py``, which names each one.

It sits in ``stateless/`` (torch only, nothing else of ours): the lowest floor every user may
import, the generated models' runtime included.  The pipelining engine's modules are imported on
first use, not here: importing them loads ``torch.export`` (about a second), which a generated
model importing ``stateless`` must not pay.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.hooks import RemovableHandle

__all__ = [
    "OpOverload", "TorchDispatchMode", "tree_leaves", "SPLIT_INPUTS",
    "own_parameters", "own_buffers", "own_children", "set_own_children", "non_persistent_buffers",
    "forward_hooks", "forward_pre_hooks", "register_load_state_dict_pre_hook", "view_base", "storage_id", "op_schema",
    "autograd_sequence_nr", "foreach_norms", "ignore_in_data_parallel", "new_group",
    "annotate_split_points", "pipe_split_op", "stage_backward_weight", "drop_warmup_messages_to",
    "p2p_helpers", "set_p2p_helpers", "action_parts", "compiled_graph_module",
]

# -- nn.Module's own tables ---------------------------------------------------------------------------
# The live dicts, not copies: callers edit them in place (replace a parameter by its meta twin, drop a
# shared weight, reorder children) where the public setters would run their checks or dedup by identity.


def own_parameters(module: nn.Module) -> dict[str, nn.Parameter | None]:
    """``module._parameters``: its own parameters (None entries included), by name, in registration order.

    Unlike ``named_parameters(recurse=False)`` it hashes nothing: a tracer's wrapped parameter
    (FTPipe's) cannot be hashed.
    """
    return module._parameters


def own_buffers(module: nn.Module) -> dict[str, torch.Tensor | None]:
    """``module._buffers``: its own buffers (None entries included), by name."""
    return module._buffers


def own_children(module: nn.Module) -> dict[str, nn.Module | None]:
    """``module._modules``: its direct children by name, one entry per name (a module under two names twice)."""
    return module._modules


def set_own_children(module: nn.Module, children: dict[str, nn.Module | None]) -> None:
    """Replace ``module._modules`` (the order ``named_children``, ``state_dict`` and the tracers follow)."""
    module._modules = children


def non_persistent_buffers(module: nn.Module) -> set[str]:
    """``module._non_persistent_buffers_set``: its own buffers left out of ``state_dict``."""
    return module._non_persistent_buffers_set


def forward_hooks(module: nn.Module) -> dict[int, Callable[..., Any]]:
    """``module._forward_hooks``: its forward hooks by handle id (deleting an entry removes the hook)."""
    return module._forward_hooks


def forward_pre_hooks(module: nn.Module) -> dict[int, Callable[..., Any]]:
    """``module._forward_pre_hooks``: its forward pre-hooks by handle id."""
    return module._forward_pre_hooks


def register_load_state_dict_pre_hook(module: nn.Module, hook: Callable[..., Any]) -> RemovableHandle:
    """``module._register_load_state_dict_pre_hook(hook)``: ``hook(state_dict, prefix, local_metadata, strict,
    missing_keys, unexpected_keys, error_msgs)``, the signature the public method's hook lacks (no module)."""
    return module._register_load_state_dict_pre_hook(hook)


# -- tensors, ops and autograd --------------------------------------------------------------------------
OpOverload = torch._ops.OpOverload  # the target of an aten node in an exported or dispatched graph


def view_base(tensor: torch.Tensor) -> torch.Tensor | None:
    """``tensor._base``: the tensor it is a view of, None for a tensor owning its storage."""
    return tensor._base


def storage_id(tensor: torch.Tensor) -> int:
    """``untyped_storage()._cdata``: one number per storage while it lives (raises for a tensor without one)."""
    return tensor.untyped_storage()._cdata


def op_schema(op: OpOverload) -> torch.FunctionSchema:
    """``op._schema``: the aten schema (arguments, aliasing, mutability) of an op overload."""
    return op._schema


def autograd_sequence_nr(node: torch.autograd.graph.Node) -> int:
    """``node._sequence_nr()``: the order autograd made ``node`` in during the forward."""
    return node._sequence_nr()


def foreach_norms(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """Each tensor's 2-norm in one fused ``torch._foreach_norm`` where ``clip_grad_norm_`` would fuse them
    (``clip_grad._has_foreach_support``), else None: the caller takes them one by one, as stock does."""
    if not tensors or not torch.nn.utils.clip_grad._has_foreach_support(list(tensors), tensors[0].device):
        return None
    return list(torch._foreach_norm(list(tensors), 2.0))


def ignore_in_data_parallel(module: nn.Module, names: Iterable[str]) -> None:
    """``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``: DDP neither syncs nor
    broadcasts these parameters and buffers of ``module`` (set before it is wrapped)."""
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, list(names))


def new_group(ranks: Sequence[int]) -> dist.ProcessGroup | None:
    """``dist.new_group(ranks)`` (every rank must call it, in one order); None on a rank outside ``ranks``.

    There torch returns its marker ``GroupMember.NON_GROUP_MEMBER`` (-100), which torch 2.14 types
    and 2.13 does not (an unannotated result): None says the same in one type under both.
    """
    group = dist.new_group(list(ranks))
    return None if group == dist.GroupMember.NON_GROUP_MEMBER else group


# -- torch.distributed.pipelining -----------------------------------------------------------------------
# The schedule method the timeline times as the batch's split into micro-batches (by name: it wraps it).
SPLIT_INPUTS = "_split_inputs"


def _engine(module: str) -> ModuleType:
    """``torch.distributed.pipelining.<module>``, imported on first use (see the module docstring)."""
    return importlib.import_module(f"torch.distributed.pipelining.{module}")


def annotate_split_points(module: nn.Module, spec: dict[str, Any]) -> None:
    """``_IR.annotate_split_points``: split the traced graph before (or after) each named submodule."""
    _engine("_IR").annotate_split_points(module, spec)


def pipe_split_op() -> Any:
    """``_IR.aten_pipe_split_alias``: the op a ``pipe_split`` marker is in the exported graph."""
    return _engine("_IR").aten_pipe_split_alias


def stage_backward_weight(weights: Iterable[nn.Parameter], param_groups: list[dict[str, Any]], *,
                          retain_graph: bool) -> tuple[torch.Tensor | None, ...]:
    """``_backward.stage_backward_weight``: the weight-gradient half of a split backward."""
    return _engine("_backward").stage_backward_weight(iter(weights), param_groups, retain_graph=retain_graph)


def drop_warmup_messages_to(stage: Any, rank: int) -> None:
    """Leave out of ``stage``'s communicator warm-up (``_get_init_p2p_neighbors_ops``) the messages to ``rank``."""
    warmup = stage._get_init_p2p_neighbors_ops
    stage._get_init_p2p_neighbors_ops = lambda: [op for op in warmup() if op.peer != rank]


def p2p_helpers() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The schedules' ``_batch_p2p(ops, desc)`` and ``_wait_batch_p2p(works)``: every message goes through them."""
    schedules = _engine("schedules")
    return schedules._batch_p2p, schedules._wait_batch_p2p


def set_p2p_helpers(post: Callable[..., Any], wait: Callable[..., Any]) -> None:
    """Make the schedules post and wait for their messages with ``post`` and ``wait`` (see :func:`p2p_helpers`)."""
    schedules = _engine("schedules")
    vars(schedules).update(_batch_p2p=post, _wait_batch_p2p=wait)


def action_parts(action: Any) -> list[tuple[int, str, int | None]]:
    """A schedule's ``_Action`` as (stage index, kind, micro-batch), one per part in the order they run.

    The kind is its ``_ComputationType``'s value (``F``, ``B``, ``I``, ``W``, communication kinds);
    an overlapped action (``OVERLAP_F_B``) is its ``sub_actions``.
    """
    return [(part.stage_index, part.computation_type.value, part.microbatch_index)
            for part in action.sub_actions or (action,)]


# -- torch.export's unflattened modules ----------------------------------------------------------------------
def compiled_graph_module(module: nn.Module) -> torch.fx.GraphModule | None:
    """The GraphModule an unflattened submodule (``torch.export.unflatten``'s ``InterpreterModule``, what the
    engine's stage modules hold) runs its ``graph`` through when not interpreting it; None for other modules."""
    found = vars(module).get("graph_module")
    return found if isinstance(found, torch.fx.GraphModule) else None
