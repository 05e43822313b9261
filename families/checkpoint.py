"""A HuggingFace model directory read key by key: its config, every tensor's shape, and only the tensors asked for.

The weights are ``model.safetensors``, a sharded ``model.safetensors.index.json``,
or ``pytorch_model.bin`` (the only form transformers 4.5.1 writes).  Shapes come
from the safetensors headers (or the lazily mapped ``.bin``) without reading any
tensor data; :meth:`Checkpoint.load` then reads the keys a stage needs and nothing
else, and records them (:attr:`Checkpoint.loaded`), so a run can show which
tensors a rank read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError
from common.files import read_json_object

CONFIG = "config.json"
SAFETENSORS, SAFETENSORS_INDEX, BIN = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
MAX_JSON_BYTES = 64 << 20
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}  # safetensors' dtype names


def _safe_open(path: Path) -> Any:
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # noqa: BLE001 (SafetensorError, OSError: a truncated or foreign file)
        raise UserError(f"checkpoint file {path} is not a readable safetensors file: "
                        f"{' '.join(str(exc).split())[:200]}") from None


class Checkpoint:
    """The weights and config of one HF model directory (``--checkpoint DIR``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        if not directory.is_dir():
            raise UserError(f"checkpoint {directory} is not a directory (give a HF model directory: config.json "
                            f"and {SAFETENSORS} or {BIN})")
        if not (directory / CONFIG).is_file():
            raise UserError(f"checkpoint {directory} has no {CONFIG}")
        self.config: dict[str, Any] = read_json_object(directory / CONFIG, "checkpoint config", MAX_JSON_BYTES)
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, torch.dtype] = {}  # each tensor's dtype in the file (a save writes it back so)
        self._file_of: dict[str, Path] = {}
        self._handles: dict[Path, Any] = {}
        self._bin: dict[str, torch.Tensor] | None = None
        self.loaded: list[str] = []
        if (directory / SAFETENSORS).is_file():
            self._add_safetensors(directory / SAFETENSORS)
        elif (directory / SAFETENSORS_INDEX).is_file():
            index = read_json_object(directory / SAFETENSORS_INDEX, "checkpoint index", MAX_JSON_BYTES)
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise UserError(f"{directory / SAFETENSORS_INDEX} has no weight_map of key -> file name")
            for name in sorted(set(weight_map.values())):
                shard = directory / name
                if Path(name).name != name or not shard.is_file():
                    raise UserError(f"{directory / SAFETENSORS_INDEX} names shard {name!r}, which is not a file "
                                    f"of {directory}")
                self._add_safetensors(shard)
            missing = sorted(set(weight_map) - set(self.shapes))
            if missing:
                raise UserError(f"{directory / SAFETENSORS_INDEX} maps {missing[0]} to a shard that lacks it")
        elif (directory / BIN).is_file():
            self._add_bin(directory / BIN)
        else:
            raise UserError(f"checkpoint {directory} has no weights ({SAFETENSORS}, {SAFETENSORS_INDEX} or {BIN})")

    def _add_safetensors(self, path: Path) -> None:
        handle = _safe_open(path)
        self._handles[path] = handle
        for key in handle.keys():
            view = handle.get_slice(key)
            self.shapes[key] = tuple(view.get_shape())
            self.dtypes[key] = _DTYPES.get(view.get_dtype(), torch.float32)
            self._file_of[key] = path

    def _add_bin(self, path: Path) -> None:
        try:  # mmap: tensors are read from disk only when touched
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as exc:  # noqa: BLE001 (a truncated zip, a pickle of something else)
            raise UserError(f"checkpoint file {path} is not a readable torch state dict: "
                            f"{' '.join(str(exc).split())[:200]}") from None
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise UserError(f"checkpoint file {path} does not hold a state dict of tensors")
        self._bin = state
        for key, value in state.items():
            self.shapes[key] = tuple(value.shape)
            self.dtypes[key] = value.dtype
            self._file_of[key] = path

    def load(self, keys: Iterable[str]) -> dict[str, torch.Tensor]:
        """The tensors of ``keys`` (each read from its file now), recorded in :attr:`loaded`; a floating-point one
        holding NaN or an infinite value is refused (a model of such weights trains to NaN)."""
        found = {}
        for key in keys:
            path = self._file_of[key]
            try:
                if self._bin is not None:
                    value = self._bin[key].clone()  # off the mapping: the file may be replaced by a later save
                else:
                    value = self._handles[path].get_tensor(key)
            except Exception as exc:  # noqa: BLE001 (a file truncated after its header was read)
                raise UserError(f"cannot read {key} from {path}: {' '.join(str(exc).split())[:200]}") from None
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                what = "NaN" if bool(torch.isnan(value).any()) else "an infinite value"
                raise UserError(f"checkpoint {self.directory}: {key} holds {what}: a model of non-finite weights "
                                f"trains to NaN (give a checkpoint of finite weights)")
            found[key] = value
            self.loaded.append(key)
        return found


def describe_shape(shape: tuple[int, ...]) -> str:
    return json.dumps(list(shape))


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """Write ``tensors`` as a safetensors file into ``path`` (a staged temporary, common.atomic.stage), one tensor
    at a time.  safetensors' own ``save_file`` writes a ``.tmpXXXXXX`` of its own beside the file and renames it:
    a rank stopped mid-write would leave that behind, a name no cleanup can tell from a user's file."""
    names = {dtype: name for name, dtype in _DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for key in sorted(tensors):
        tensor = tensors[key]
        size = tensor.numel() * tensor.element_size()
        header[key] = {"dtype": names[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset,
                                                                                                   offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data 8-byte aligned, as safetensors writes it
    with open(path, "wb") as handle:
        handle.write(len(text).to_bytes(8, "little") + text)
        for key in sorted(tensors):
            handle.write(tensors[key].detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().data)
