"""The checks of a generated package against its release's stock code, run by ``convert-model`` in a process
of its own (it imports torch and that very release of transformers).

    python -m converter.trace_check SPEC.json

``SPEC.json`` (written by :mod:`converter.checks`) names the generated package, the stock
module and config class, the config (the recipe's ``shapes.verify``), each class's one output and
the family's inputs.  For every class, the stock model is built on the CPU (seed 0) and the
generated one loads its weights; the inputs are the family's micro-batch (every input the class
accepts), then the same with each optional input (all but the first) absent once: the paths
the model keeps.  A combination stock itself refuses (T5Model without decoder ids) is no path and
is skipped.  On each path, in eval mode:

- the fx check: the generated model traces with ``torch.fx.symbolic_trace``, absent inputs as
  concrete ``None``;
- with ``compare`` (an unverified release): the generated output is ``torch.equal`` to stock's
  (the class's output field, or stock's first output where that field is None: no labels, no
  loss), and the traced graph computes what eager does.

Exits 0 when every check passes, printing how many classes and paths it checked; otherwise prints one line for the first
failure, with the generated line that raised it, and exits 1.  Exit 2: the package cannot be
imported or built, or the process imports another release than the one checked.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError
from families.definition import InputSpec
from families.models import MicroBatch, accepted, make_inputs

_ROWS = 2  # the micro-batch of the checks: tiny, every path of the stack


def _import_package(directory: Path, name: str) -> object:
    spec = importlib.util.spec_from_file_location(name, directory / "__init__.py",
                                                  submodule_search_locations=[str(directory)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _where(exc: BaseException, generated: Path) -> str:
    """``file:line: `code``` of the deepest frame of the generated file in the traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == generated.resolve()]
    if not frames:
        return "outside the generated file"
    frame = frames[-1]
    return f"at {generated.name}:{frame.lineno}: `{(frame.line or '').strip()}`"


def _message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _reference(output: Any, field: str) -> Any:
    """Stock's value of ``field`` (a ModelOutput's or a tuple's first), else its first output."""
    if isinstance(output, tuple):
        return output[0]
    value = getattr(output, field, None)
    return value if value is not None else output.to_tuple()[0]


def _config(path: str, kwargs: dict[str, Any]) -> Any:
    module, _, name = path.rpartition(".")
    config_class = getattr(importlib.import_module(module), name)
    if hasattr(config_class(), "_attn_implementation"):  # several attention codes: stock runs the eager one, ours
        kwargs = {**kwargs, "attn_implementation": "eager"}
    return config_class(**kwargs)


def wrong_release(package: str, version: str) -> str | None:
    """Why the ``package`` this process imports is not ``version``; None when it is."""
    imported = importlib.import_module(package)
    found = getattr(imported, "__version__", "?")
    if found == version:
        return None
    return f"this process imports {package} {found} (from {Path(imported.__file__ or '?').parent}), not {version}"


def check(spec: dict[str, Any]) -> tuple[int, str]:
    """(exit code, one line): 0 when every check passes."""
    torch.set_num_threads(1)  # tiny models, beside other work on a shared machine
    problem = wrong_release(spec["package"], spec["version"])
    if problem is not None:
        return 2, problem
    directory = Path(spec["root"]) / spec["package_dir"]
    generated = directory / spec["module_file"]
    try:
        package = _import_package(directory, spec["import_name"])
        stock = importlib.import_module(spec["stock_module"])
        config = _config(spec["config"], spec["config_kwargs"])
    except Exception as exc:  # the generated package must import; report why it does not
        return 2, f"{generated.name} does not import: {_message(exc)} {_where(exc, generated)}"
    micro_batch = MicroBatch(_ROWS, spec["lengths"])
    checked = skipped = 0
    for name, field in spec["classes"].items():
        try:
            torch.manual_seed(0)
            reference = getattr(stock, name)(config).eval()
            model = getattr(package, name)(config).eval()
            model.load_state_dict(reference.state_dict(), strict=True)
        except Exception as exc:
            return 2, f"{name} cannot be built from shape {spec['shape']!r}: {_message(exc)} {_where(exc, generated)}"
        specs = [InputSpec.from_dict(entry, "the check's spec") for entry in spec["inputs"][name]]
        given = accepted(specs, model.forward)
        values = make_inputs(given, config, micro_batch, "cpu")
        paths = [values] + [{k: v for k, v in values.items() if k != s.name} for s in given[1:]]
        for inputs in paths:
            missing = [s.name for s in given if s.name not in inputs]
            where = f"{name} ({'without ' + missing[0] if missing else 'every input'})"
            with torch.no_grad():
                try:
                    expected = _reference(reference(**inputs), field)
                except Exception:  # noqa: BLE001 (stock refuses this combination: not a path of the model)
                    skipped += 1
                    continue
                code, line = _check_path(model, inputs, expected, spec["compare"], where, generated)
            if code:
                return code, line
            checked += 1
    return 0, f"{len(spec['classes'])} classes, {checked} paths; stock refuses {skipped} input combinations"


def _check_path(model: Any, inputs: dict[str, Any], expected: Any, compare: bool, where: str,
                generated: Path) -> tuple[int, str]:
    if compare:
        try:
            actual = model(**inputs)
        except Exception as exc:
            return 1, f"{where} raises {_message(exc)} {_where(exc, generated)}"
        if not isinstance(actual, torch.Tensor):
            return 1, f"{where} returns {type(actual).__name__}, not one tensor"
        if actual.shape != expected.shape:
            return 1, f"{where}: output has shape {tuple(actual.shape)}, stock's {tuple(expected.shape)}"
        if not torch.equal(actual, expected):
            return 1, f"{where}: output differs from stock (max |difference| {(actual - expected).abs().max():.3g})"
    absent = {p: None for p in inspect.signature(model.forward).parameters if p not in inputs}
    try:
        traced = torch.fx.symbolic_trace(model, concrete_args=absent)
    except Exception as exc:  # the first blocker, whatever it is, is the report
        return 1, f"{where} does not trace with torch.fx: {_message(exc)} {_where(exc, generated)}"
    if compare and not torch.equal(traced(**inputs), actual):
        return 1, f"{where}: the fx graph computes another output than eager"
    return 0, ""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m converter.trace_check SPEC.json", file=sys.stderr)
        return 2
    try:
        code, line = check(json.loads(Path(args[0]).read_text(encoding="utf-8")))
    except UserError as exc:
        code, line = 2, exc.one_line()
    if line:
        print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
