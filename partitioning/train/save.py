"""Saving a run: a stock HF model directory plus each stage's training state, written all or nothing.

Every rank sends rank 0 its tensors (stock key names; a tied weight once) and
its training state (optimizer, scheduler, RNG); rank 0 writes

* ``config.json``, ``pytorch_model.bin`` (every stock key, tied ones sharing
  storage: what ``save_pretrained`` of 4.x writes and every release loads) and
  ``model.safetensors`` (one key per tensor: what later releases prefer);
* ``train_state.json`` (the step, the data position, the settings) and
  ``train_state/stage-<r>.pt`` per stage,

in one :func:`~common.atomic.write_all_atomic`: a crash mid-save leaves the
previous checkpoint whole.  Saving gathers the whole model on rank 0.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common.atomic import recover, write_all_atomic
from common.errors import UserError
from common.files import read_json_object
from partitioning.train.checkpoint import BIN, CONFIG, SAFETENSORS, Checkpoint
from partitioning.train.model import source_key
from partitioning.train.stage import PREFIX, StageModel

STATE = "train_state.json"
GENERATOR = "train-model"


def stage_file(rank: int) -> str:
    return f"train_state/stage-{rank}.pt"


def check_save_dir(directory: Path) -> None:
    """``--save DIR`` may be new, empty, or a directory this command wrote; nothing else is overwritten."""
    if directory.exists() and not directory.is_dir():
        raise UserError(f"--save {directory} is a file: give a directory")
    if directory.is_dir() and any(directory.iterdir()) and not _ours(directory):
        raise UserError(f"--save {directory} is a directory train-model did not write (no {STATE}): "
                        f"give a new or empty directory")


def _ours(directory: Path) -> bool:
    try:
        return read_json_object(directory / STATE, "train state", 1 << 20).get("generator") == GENERATOR
    except (UserError, OSError):
        return False


def read_state(directory: Path, stages: int) -> dict[str, Any]:
    """``--resume DIR``'s run state (checked: a directory this command wrote for as many stages)."""
    if not directory.is_dir() or not _ours(directory):
        raise UserError(f"--resume {directory} is not a checkpoint train-model saved (no {STATE})")
    state = read_json_object(directory / STATE, "train state", 1 << 20)
    if state.get("stages") != stages or not isinstance(state.get("step"), int):
        raise UserError(f"--resume {directory} was saved by a {state.get('stages')}-stage run; this plan has "
                        f"{stages} stages")
    for rank in range(stages):
        if not (directory / stage_file(rank)).is_file():
            raise UserError(f"--resume {directory} lacks {stage_file(rank)}")
    return state


def _bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def save(stage: StageModel, directory: Path, training: dict[str, Any], run_state: dict[str, Any],
         source: Checkpoint) -> None:
    """Write the checkpoint of ``stage``'s whole model and every stage's ``training`` state (a collective)."""
    tensors = {}
    owned = stage.owned
    for name, tensor in [*stage.module.named_parameters(), *stage.module.named_buffers()]:
        if name in owned or name not in stage.names:  # a tied copy: its first holder sends it
            tensors[name.removeprefix(PREFIX)] = tensor.detach().cpu()
    parts: list[Any] = [None] * stage.stages if stage.rank == 0 else []
    dist.gather_object((tensors, _bytes(training)), parts if stage.rank == 0 else None, dst=0)
    if stage.rank == 0:
        _write(stage, directory, parts, run_state, source)
    dist.barrier()


def _write(stage: StageModel, directory: Path, parts: list[Any], run_state: dict[str, Any],
           source: Checkpoint) -> None:
    from safetensors.torch import save as safetensors_bytes

    meta = stage.meta
    found: dict[str, torch.Tensor] = {}
    for tensors, _ in parts:
        for name, tensor in tensors.items():
            found.setdefault(name, tensor)
    aliases: dict[tuple[str, ...], list[str]] = {}  # one tensor's names (BERT's decoder bias is its head's bias)
    for name, keys in meta.keys.items():
        aliases.setdefault(keys, []).append(name)
    by_key: dict[str, torch.Tensor] = {}
    for keys, names in aliases.items():
        tensor = next((found[name] for name in names if name in found), None)
        if tensor is None:  # in no stage (a parameter the forward never reads): as it was loaded
            key = source_key(meta, names[0], source)
            tensor = source.load([key])[key] if key is not None else meta.buffers[names[0]]
        for key in keys:
            by_key[key] = tensor
    state = {key: by_key[key] for key in meta.state_keys}
    first: dict[int, str] = {}
    for key, tensor in state.items():
        first.setdefault(id(tensor), key)
    config = stage.config
    config.architectures = [stage.class_name]
    directory = Path(os.path.abspath(directory))
    files = {directory / CONFIG: config.to_json_string().encode(),
             directory / BIN: _bytes(state),
             directory / SAFETENSORS: safetensors_bytes({key: state[key].contiguous() for key in first.values()}),
             directory / STATE: json.dumps({"generator": GENERATOR, **run_state}, indent=1).encode()}
    for rank, (_, training) in enumerate(parts):
        files[directory / stage_file(rank)] = training
    if directory.is_dir():
        recover(directory)
    write_all_atomic(files, root=directory)


def training_state(optimizer: torch.optim.Optimizer, scheduler: Any, names: list[str]) -> dict[str, Any]:
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng, "names": names}


def restore(directory: Path, rank: int, optimizer: torch.optim.Optimizer, scheduler: Any, names: list[str]) -> None:
    path = directory / stage_file(rank)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (a truncated or foreign file)
        raise UserError(f"cannot read {path}: {' '.join(str(exc).split())[:200]}") from None
    if state.get("names") != names:
        raise UserError(f"{path} holds the state of other parameters: resume with the plan it was saved with")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["cpu"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["rng"]["cuda"])
