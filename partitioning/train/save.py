"""Saving a run: a stock HF model directory plus each stage's training state, written all or nothing.

A rank holds its stage, not the model, and saving keeps it so.  Each rank of
the first data-parallel replica writes its own stage's tensors as one shard,
``model-0000k-of-0000K.safetensors`` (stock key names; a tied weight once, by
its first holder), and its training state (``train_state/stage-<s>.pt``:
AdamW, scheduler, RNG, parameter names); the other replicas write only their
RNG state.  Rank 0 writes ``config.json``, ``model.safetensors.index.json`` and
``train_state.json``, and carries over the tokenizer files and ``generation_config.json`` of the
directory the run started from (:data:`COMPANIONS`).  What transformers releases load decides the extras
(:func:`weight_files`): before 4.18 one ``pytorch_model.bin`` holding every
key (gathered on rank 0: the whole model in its memory once), 4.18 to 4.24
per-stage ``pytorch_model-0000k-of-0000K.bin`` shards and their index, a tied weight under each of its keys.

Every file is staged beside its target by the rank writing it
(:func:`common.atomic.stage`); after a barrier rank 0 renames them all into
place under one journal (:func:`common.atomic.commit_staged`), removing stale
weight files in the same commit.  A crash before the commit point leaves the
previous checkpoint whole; the next save (or ``--resume``) rolls back and
removes what dead writers staged.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from common.atomic import cannot_create_in, commit_staged, is_temporary, recover, stage
from common.errors import UserError
from common.files import read_json_object
from common.versions import Release
from families.checkpoint import BIN, CONFIG, SAFETENSORS, SAFETENSORS_INDEX, Checkpoint, write_safetensors
from families.loading import source_key
from partitioning.train.layout import METRICS, OUTSIDE_COMMIT, SETTINGS, STATE
from partitioning.train.loss_scale import LossScale
from partitioning.train.metrics import history
from partitioning.train.stage import StageModel

GENERATOR = "train-model"
BIN_INDEX = "pytorch_model.bin.index.json"
SHARDED_BIN_FROM, SAFETENSORS_FROM = Release.parse("4.18.0"), Release.parse("4.25.0")  # what from_pretrained reads
# What a model directory holds besides its weights and config that users load with it: the tokenizer's files and
# the generation defaults (save_pretrained of a tokenizer, of a GenerationConfig); a save carries over those of the
# directory the run started from.
COMPANIONS = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
              "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model",
              "chat_template.jinja", "chat_template.json", "generation_config.json")
_CHECKPOINT, _REMOVED = re.compile(r"^checkpoint-(\d+)$"), re.compile(r"^\.checkpoint-\d+\.removed$")
_WEIGHTS = re.compile(r"^(model|pytorch_model)(-\d{5}-of-\d{5})?\.(safetensors|bin)(\.index\.json)?$")


def stage_file(rank: int) -> str:
    return f"train_state/stage-{rank}.pt"


def replica_file(rank: int, replica: int) -> str:
    return f"train_state/stage-{rank}-replica-{replica}.pt"


def shard_name(rank: int, stages: int, extension: str) -> str:
    prefix = "model" if extension == "safetensors" else "pytorch_model"
    return f"{prefix}-{rank + 1:05d}-of-{stages:05d}.{extension}"


def weight_files(version: str) -> tuple[str, ...]:
    """The weight formats a checkpoint for transformers ``version`` holds besides the safetensors shards."""
    release = Release.parse(version)
    if release < SHARDED_BIN_FROM:
        return (BIN,)  # one file: these releases read neither safetensors nor a sharded index
    return ("sharded-bin",) if release < SAFETENSORS_FROM else ()


def checkpoint_dir(directory: Path, step: int) -> Path:
    """Where ``--save-total-limit`` puts the save of step ``step`` (the run's last save goes to ``directory``)."""
    return directory / f"checkpoint-{step}"


def prune(directory: Path, keep: int) -> None:
    """Keep the newest ``keep`` ``checkpoint-<step>/`` of ``directory`` (rank 0, after a commit): each older one is
    renamed out of the way first (one rename: a checkpoint is whole or gone), then removed."""
    found = sorted((int(match[1]), path) for path in directory.iterdir()
                   if (match := _CHECKPOINT.match(path.name)) and path.is_dir())
    for _, path in found[:-keep]:
        os.replace(path, path.with_name(f".{path.name}.removed"))
    for leftover in directory.iterdir():  # this prune's, and any a killed one left
        if _REMOVED.match(leftover.name):
            shutil.rmtree(leftover, ignore_errors=True)


def check_save_dir(directory: Path) -> None:
    """``--save DIR`` may be new, empty, or a directory this command wrote; nothing else is overwritten."""
    if directory.exists() and not directory.is_dir():
        raise UserError(f"--save {directory} is a file: give a directory")
    existing = Path(os.path.abspath(directory))
    while not existing.exists():  # the directories missing are made by the first save
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"--save {directory} lies under {existing}, which is a file: give a directory")
    reason = cannot_create_in(existing)
    if reason is not None:
        raise UserError(f"--save {directory}: cannot write into {existing} ({reason})")
    if (directory.is_dir() and any(not _left_by_a_run(path) for path in directory.iterdir())
            and not _ours(directory)):
        raise UserError(f"--save {directory} is a directory train-model did not write (no {STATE}): "
                        f"give a new or empty directory")


def _left_by_a_run(path: Path) -> bool:
    """What a run that died before its final save leaves in its ``--save`` directory: the files written outside
    the commits, its checkpoints, their leftovers."""
    return (is_temporary(path.name) or path.name in OUTSIDE_COMMIT or bool(_REMOVED.match(path.name))
            or (bool(_CHECKPOINT.match(path.name)) and _ours(path)))


def tidy(directory: Path) -> None:
    """After the ranks stopped mid-save: roll back its commit if it began, remove the files its ranks staged."""
    checkpoints = [path for path in directory.iterdir() if _CHECKPOINT.match(path.name)] if directory.is_dir() else []
    for saved in (directory, *checkpoints):
        for folder in (saved, saved / "train_state"):
            recover(folder)


def _ours(directory: Path) -> bool:
    try:
        return read_json_object(directory / STATE, "train state", 1 << 20).get("generator") == GENERATOR
    except (UserError, OSError):
        return False


def read_state(directory: Path, stages: int, replicas: int = 1) -> dict[str, Any]:
    """``--resume DIR``'s run state (checked: a directory this command wrote for as many stages and replicas)."""
    if directory.is_dir():
        recover(directory)  # a save that died mid-commit: back to the previous checkpoint
    if not directory.is_dir() or not _ours(directory):
        raise UserError(f"--resume {directory} is not a checkpoint train-model saved (no {STATE})")
    state = read_json_object(directory / STATE, "train state", 1 << 20)
    if state.get("stages") != stages or not isinstance(state.get("step"), int):
        raise UserError(f"--resume {directory} was saved by a {state.get('stages')}-stage run; this plan has "
                        f"{stages} stages")
    if state.get("data_parallel", 1) != replicas:
        raise UserError(f"--resume {directory} was saved by a run of --data-parallel {state.get('data_parallel', 1)}"
                        f", not {replicas}")
    needed = [stage_file(rank) for rank in range(stages)]
    needed += [replica_file(rank, replica) for rank in range(stages) for replica in range(1, replicas)]
    for name in needed:
        if not (directory / name).is_file():
            raise UserError(f"--resume {directory} lacks {name}")
    return state


def _held(model: StageModel, source: Checkpoint) -> dict[str, torch.Tensor]:
    """The tensors this stage writes, each under the first of its stock keys in the state dict, in the
    dtype ``source`` holds it in (a bf16 checkpoint stays bf16; training keeps fp32 weights)."""
    position = {key: index for index, key in enumerate(model.meta.state_keys)}
    held: dict[str, torch.Tensor] = {}
    for name, tensor in [*model.module.named_parameters(), *model.module.named_buffers()]:
        if name in model.names and name not in model.owned:
            continue  # a tied copy: its first holder writes it
        # none for a constant the export lifted into the stage (torch.tensor(...) in a forward): not model state
        keys = [key for key in model.meta.keys.get(model.stateless(name), ()) if key in position]
        if keys:
            held.setdefault(min(keys, key=position.__getitem__), tensor.detach().to(_file_dtype(model, name, source,
                                                                                                tensor)))
    return held


def _file_dtype(model: StageModel, name: str, source: Checkpoint, tensor: torch.Tensor) -> torch.dtype:
    key = source_key(model.meta, model.stateless(name), source)
    return source.dtypes.get(key, tensor.dtype) if key is not None else tensor.dtype


def _masters(model: StageModel, source: Checkpoint) -> dict[str, torch.Tensor]:
    """The weights a save rounds to the checkpoint's dtype, as trained (fp32): what ``--resume`` continues from."""
    return {model.names[name]: p.detach().clone() for name, p in model.module.named_parameters()
            if _file_dtype(model, name, source, p) != p.dtype}


def _unheld(model: StageModel, written: set[str], source: Checkpoint) -> dict[str, torch.Tensor]:
    """Tensors no stage holds (a parameter the forward never reads): as they were loaded or built."""
    position = {key: index for index, key in enumerate(model.meta.state_keys)}
    found = {}
    for name, keys in model.meta.keys.items():
        in_state = [key for key in keys if key in position]
        if in_state and not written.intersection(keys):
            key = source_key(model.meta, name, source)
            first = min(in_state, key=position.__getitem__)
            found[first] = source.load([key])[key] if key is not None else model.meta.buffers[name]
            written.add(first)
    return found


def save(model: StageModel, directory: Path, training: dict[str, Any], run_state: dict[str, Any],
         source: Checkpoint, settings: str, metrics: Path | None = None) -> None:
    """Write the checkpoint: every rank its own shard and state, rank 0 the rest and the commit (a collective).
    ``settings``: the run's, as a --config-file (partitioning/train/cli.py ``settings_text``).
    ``metrics``: the run's metrics file, whose steps so far the checkpoint holds as its own (``checkpoint-<step>/``:
    the run's file lives in the directory above)."""
    directory = Path(os.path.abspath(directory))
    if dist.get_rank() == 0:
        if directory.is_dir():
            recover(directory)  # roll back a save that died, remove what its ranks staged
        (directory / "train_state").mkdir(parents=True, exist_ok=True)
    dist.barrier()
    staged: dict[Path, Path] = {}
    writer = model.replica == 0
    written: dict[str, torch.Tensor] = {}
    if writer:
        held = _held(model, source)
        training = {**training, "masters": _masters(model, source)}
        everyone: list[Any] = [None] * model.stages
        dist.all_gather_object(everyone, sorted(held), group=model.group)
        earlier = {key for part in everyone[:model.rank] for key in part}
        written = {key: tensor.contiguous() for key, tensor in held.items() if key not in earlier}
        if model.rank == 0:
            written.update(_unheld(model, {key for part in everyone for key in part}, source))
        shard = directory / shard_name(model.rank, model.stages, "safetensors")
        staged[shard] = stage(shard, lambda path: write_safetensors(path, written, {"format": "pt"}))
        if "sharded-bin" in weight_files(model.version):
            target, binned = directory / shard_name(model.rank, model.stages, "bin"), _every_key(model, written)
            staged[target] = stage(target, lambda path: torch.save(binned, path))
        target = directory / stage_file(model.rank)
    else:
        training = {"rng": training["rng"]}
        target = directory / replica_file(model.rank, model.replica)
    staged[target] = stage(target, lambda path: torch.save(training, path))
    sizes = {key: tensor.numel() * tensor.element_size() for key, tensor in written.items()}
    parts: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
    dist.gather_object((staged, sizes, model.rank, sorted(_every_key(model, written))),
                       parts if dist.get_rank() == 0 else None, dst=0)
    if writer and BIN in weight_files(model.version):
        _gather_bin(model, written, directory, staged)
    if dist.get_rank() == 0:
        _commit(model, directory, parts, staged, run_state, settings, metrics)
    dist.barrier()


def _gather_bin(model: StageModel, written: dict[str, torch.Tensor], directory: Path,
                staged: dict[Path, Path]) -> None:
    """The one ``pytorch_model.bin`` of releases before 4.18: every key, tied ones sharing storage (rank 0)."""
    tensors: list[Any] = [None] * model.stages if model.rank == 0 else []
    dist.gather_object(written, tensors if model.rank == 0 else None, dst=0, group=model.group)
    if model.rank != 0:
        return
    by_key = _every_key(model, {key: tensor for part in tensors for key, tensor in part.items()})
    state = {key: by_key[key] for key in model.meta.state_keys}
    staged[directory / BIN] = stage(directory / BIN, lambda path: torch.save(state, path))


def _every_key(model: StageModel, found: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``found`` under every stock key of each of its tensors, tied ones sharing storage: the ``.bin`` releases
    (before 4.25) expect every key of the state dict, where the safetensors shards hold a tied weight once
    (measured: 4.20.1 reports a tied weight's other keys missing without them)."""
    state = set(model.meta.state_keys)
    by_key = {}
    for keys in model.meta.keys.values():
        tensor = next((found[key] for key in keys if key in found), None)
        if tensor is not None:
            by_key.update({key: tensor for key in keys if key in state})
    return by_key


def _commit(model: StageModel, directory: Path, parts: list[Any], staged: dict[Path, Path],
            run_state: dict[str, Any], settings: str, metrics: Path | None) -> None:
    weight_map: dict[str, str] = {}
    total = 0
    bins: dict[str, str] = {}
    for their_staged, sizes, rank, every_key in parts:
        staged.update(their_staged)
        weight_map.update({key: shard_name(rank, model.stages, "safetensors") for key in sizes})
        bins.update({key: shard_name(rank, model.stages, "bin") for key in every_key})
        total += sum(sizes.values())
    config = model.config
    config.architectures = [model.class_name]
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    files = {CONFIG: config.to_json_string().encode(), SAFETENSORS_INDEX: json.dumps(index, indent=2).encode(),
             STATE: json.dumps({"generator": GENERATOR, "data_parallel": model.replicas, **run_state},
                               indent=1).encode()}
    files[SETTINGS] = settings.encode()
    if metrics is not None:  # the reporting rank wrote the step's line before the save's first barrier
        files[METRICS] = "".join(line + "\n" for line in history(metrics.parent, run_state["step"])).encode()
    for name in COMPANIONS:
        carried = model.checkpoint.directory / name
        if carried.is_file() and os.path.abspath(carried) != os.path.abspath(directory / name):
            files[name] = carried.read_bytes()
    if "sharded-bin" in weight_files(model.version):
        files[BIN_INDEX] = json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(bins.items()))},
                                      indent=2).encode()
    for name, data in files.items():
        staged[directory / name] = stage(directory / name, data)
    stale = [path for folder in (directory, directory / "train_state") for path in folder.iterdir()
             if path not in staged and (_WEIGHTS.match(path.name) or path.name == SAFETENSORS
                                        or path.suffix == ".pt") and path.is_file()]
    commit_staged(staged, directory, stale)


def training_state(optimizer: torch.optim.Optimizer, scheduler: Any, names: list[str],
                   loss_scale: LossScale | None = None) -> dict[str, Any]:
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng, "names": names,
            **({"loss_scale": loss_scale.state_dict()} if loss_scale is not None else {})}


def _load(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (a truncated or foreign file)
        raise UserError(f"cannot read {path}: {' '.join(str(exc).split())[:200]}") from None


def restore(directory: Path, rank: int, optimizer: torch.optim.Optimizer, scheduler: Any, names: list[str],
            parameters: list[torch.nn.Parameter], replica: int = 0, loss_scale: LossScale | None = None) -> None:
    """Continue from ``directory``: ``parameters`` (the stage's, named ``names``), the optimizer's state and, of
    an fp16 run, its loss scale (a run saved without one starts from the initial scale)."""
    path = directory / stage_file(rank)
    state = _load(path)
    if state.get("names") != names:
        raise UserError(f"{path} holds the state of other parameters: resume with the plan it was saved with")
    groups = len(state["optimizer"]["param_groups"])
    if groups != len(optimizer.param_groups):  # saved before weight decay spared biases and norms (two groups)
        raise UserError(f"{path} holds {groups} AdamW parameter group(s) where this train-model steps "
                        f"{len(optimizer.param_groups)} (--decay-all-parameters steps one): resume with the flags it "
                        f"was saved with, or start from its weights with --checkpoint {directory}")
    saved, stepped = (sum(len(group["params"]) for group in each["param_groups"])
                      for each in (state["optimizer"], optimizer.state_dict()))
    if saved != stepped:  # saved before train-model stepped a large parameter in pieces (PiecewiseAdamW)
        raise UserError(f"{path} holds AdamW state for {saved} tensors where this train-model steps {stepped}: it "
                        f"was saved by an older train-model; start from its weights with --checkpoint {directory}")
    optimizer.load_state_dict(state["optimizer"])
    masters = state.get("masters") or {}
    with torch.no_grad():  # the weights as trained, where the checkpoint holds them rounded (bf16, fp16)
        for name, parameter in zip(names, parameters):
            if name in masters:
                parameter.copy_(masters[name])
    scheduler.load_state_dict(state["scheduler"])
    if loss_scale is not None and "loss_scale" in state:
        loss_scale.load_state_dict(state["loss_scale"])
    rng = state["rng"] if replica == 0 else _load(directory / replica_file(rank, replica))["rng"]
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
