"""The model an IPU placement's ``parallelize()`` annotates, with its weights from a HF checkpoint directory.

``train-model --checkpoint DIR`` and the IPU target start from the same
directory: :func:`load_placed_model` builds the plan's model (its family,
class and config, as ``train-model`` does) on ``meta``, checks the checkpoint
against it (family, class, sizes, every key and shape), reads every tensor
(:mod:`families.loading`: stock keys, a tied weight once, buffers the
file lacks as built), puts it in the form the placement was made for
(``--ipu-form``) and, given the generated module, calls its ``parallelize()``::

    model = load_placed_model(read_plan(Path("plan.json")), Path("my-gpt2"), code=Path("ipu_parallelize.py"))
    training_model = poptorch.trainingModel(model, options, optimizer)

poptorch is imported only by ``parallelize()`` (the generated code imports it
when called); a machine without the Poplar SDK gets one line saying so.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.errors import UserError
from families.checkpoint import Checkpoint
from families.family import trained_model
from families.loading import build_meta, check_checkpoint, materialize
from partitioning.ipu.errors import require_poptorch
from partitioning.plan import Plan

FORMS = ("stateless", "stateful")


def load_model(plan: Plan, checkpoint: Path, form: str = "stateless") -> nn.Module:
    """The plan's model in ``form`` (``--ipu-form``), every weight from the HF model directory ``checkpoint``."""
    if form not in FORMS:
        raise UserError(f"unknown form {form!r}; known: {', '.join(FORMS)}")
    family, class_name, config, _, _ = trained_model(plan.model)
    source = Checkpoint(checkpoint)
    meta = build_meta(family, class_name, config)  # the stateless form (of a family with a shared weight)
    check_checkpoint(meta, source, family, class_name, config)
    materialize(meta.model, meta, source, torch.device("cpu"), f"checkpoint {checkpoint}")
    model: Any = meta.model  # a generated model: make_stateful() and stateful_state_dict() beyond nn.Module
    if form == "stateful" and hasattr(model, "make_stateful"):
        model.make_stateful()  # the generated models' other form: the stock module layout, the same parameters
    return model.train()


def load_placed_model(plan: Plan, checkpoint: Path, code: Path, form: str = "stateless") -> nn.Module:
    """:func:`load_model`, annotated by ``parallelize()`` of ``code`` (partition-model --target ipu's module)."""
    require_poptorch()  # before any weight is read: without the SDK, one line and nothing loaded
    if not code.is_file():
        raise UserError(f"{code} is not a file (the --ipu-code module partition-model --target ipu wrote)")
    spec = importlib.util.spec_from_file_location(f"_ipu_parallelize_{abs(hash(str(code)))}", code)
    if spec is None or spec.loader is None:
        raise UserError(f"{code} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 (an edited module that no longer runs)
        raise UserError(f"{code} does not import: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}") \
            from None
    parallelize = getattr(module, "parallelize", None)
    if not callable(parallelize):
        raise UserError(f"{code} has no parallelize(model) function")
    model = load_model(plan, checkpoint, form)
    try:
        return parallelize(model)
    except ValueError as exc:  # the generated check that the model is in the placement's form
        raise UserError(f"{code}: {exc}") from None
