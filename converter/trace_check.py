"""The fx check of a generated package, run by ``convert-model`` in a process of its own (it imports torch).

    python -m converter.trace_check --root DIR --family t5 --version 4.46.3

Builds every class of the recipe from the family's verification shape on the ``meta``
device (nothing is allocated) and traces it with ``torch.fx.symbolic_trace``, the inputs
a pipeline does not pass (those outside the family's micro-batch) fixed to ``None``.
Prints nothing and exits 0 when every class traces; otherwise prints one line for the
first blocker, with the generated line that raised it, and exits 1.  Exit 2: the
package cannot be imported or built (the line says why).
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path

from common.errors import UserError
from converter.recipes import get_recipe
from families.layout import version_dir


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


def check(root: Path, family: str, version: str) -> tuple[int, str]:
    """(exit code, one line): 0 when every class traces."""
    import torch

    from families.models import accepted, build_model
    from families.shapes import make_config

    recipe = get_recipe(family)
    definition = recipe.definition
    if definition is None:
        return 2, f"the {family} recipe has no family definition to build its classes from"
    directory = root / family / version_dir(version)
    generated = directory / Path(recipe.source).name
    try:
        package = _import_package(directory, f"convert_model_check_{family}_{version_dir(version)}")
        config = make_config(definition.config_path, definition.shapes[definition.verify_shape])
    except Exception as exc:  # the generated package must import; report why it does not
        return 2, f"{generated.name} does not import: {_message(exc)} {_where(exc, generated)}"
    for name in recipe.classes:
        try:
            model = build_model(getattr(package, name), config, "meta")
        except Exception as exc:
            return 2, f"{name} cannot be built from shape {definition.verify_shape!r}: {_message(exc)} " \
                      f"{_where(exc, generated)}"
        given = {spec.name for spec in accepted(definition.inputs, model.forward)}
        absent = {p: None for p in inspect.signature(model.forward).parameters if p not in given}
        try:
            torch.fx.symbolic_trace(model.eval(), concrete_args=absent)
        except Exception as exc:  # the first blocker, whatever it is, is the report
            return 1, f"{name} does not trace with torch.fx: {_message(exc)} {_where(exc, generated)}"
    return 0, ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m converter.trace_check", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="output root of the conversion")
    parser.add_argument("--family", required=True)
    parser.add_argument("--version", required=True)
    args = parser.parse_args(argv)
    try:
        code, line = check(args.root, args.family, args.version)
    except UserError as exc:
        code, line = 2, exc.one_line()
    if line:
        print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
