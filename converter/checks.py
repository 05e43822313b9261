"""The checks of a conversion that run its code: the fx check, and the check against stock of an unverified release.

Both run :mod:`converter.trace_check` in a process of its own (the converter never imports torch)
against the release's own stock code, before anything is written: the generated files are laid
out in a scratch directory.  The process imports that release from

- this interpreter's own installation, when it is that release;
- else a side-by-side install (:mod:`converter.installs`): the converter's cache
  (``<cache>/installs/<package>/<release>/``), then the setup's (``.venv/transformers/<release>/``).

A verified release gets the fx check (:func:`fx_check`): every class traces on every path it keeps.
An unverified one exits 0 only when checked (:func:`stock_check`): its release is installed in
the cache when it is nowhere yet (``pip install``, the era's pins), and on every path every class's
eval output must be ``torch.equal`` to stock's, and trace.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any

from common.errors import UserError
from converter import installs
from converter.recipes import Recipe
from families import installed
from families.layout import version_dir

log = logging.getLogger("converter")
ACCEPT_HINT = "pass --accept-unverified to write it unchecked"


@dataclass(frozen=True)
class Install:
    directory: Path | None  # None: this interpreter's own installation
    where: str  # for messages


def locate(package: str, version: str, cache_dir: Path) -> Install | None:
    """Where a process can import ``package`` ``version`` from; None when nowhere here."""
    try:
        if metadata.version(package) == version:
            return Install(None, f"the installed {package}")
    except metadata.PackageNotFoundError:
        pass
    directory = installed.side_by_side(package, version, cache_dir)
    return None if directory is None else Install(directory, str(directory))


def spec(recipe: Recipe, version: str, root: Path, compare: bool,
         classes: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What :mod:`converter.trace_check` needs, from the recipe's family definition.

    ``classes``: the recipe's classes to check (default: all); the check stops at its first failure, so a caller
    wanting a verdict per class checks one at a time.
    """
    definition = recipe.definition
    if definition is None:
        raise UserError(f"the {recipe.family} recipe has no family definition to build its classes from")
    chosen = recipe.classes if classes is None else classes
    return {
        "root": str(root), "package_dir": f"{recipe.family}/{version_dir(version)}",
        "module_file": PurePosixPath(recipe.source).name,
        "import_name": f"convert_model_check_{recipe.family}_{version_dir(version)}",
        "package": recipe.package, "version": version, "stock_module": recipe.module_name,
        "config": definition.config_path, "shape": definition.verify_shape,
        "config_kwargs": definition.shapes[definition.verify_shape],
        "classes": {name: definition.classes[name].output for name in chosen},
        "inputs": {name: [{"name": spec.name, **spec.to_dict()} for spec in definition.class_inputs(name)]
                   for name in chosen},
        # small and distinct: a length mixed up with another one shows
        "lengths": {name: 5 + 2 * index for index, name in enumerate(definition.lengths)},
        "compare": compare,
    }


def run(files: dict[PurePosixPath, str], recipe: Recipe, version: str, install: Install,
        compare: bool, classes: tuple[str, ...] | None = None) -> tuple[bool, str]:
    """Run the checks on ``files`` (of ``classes``, default all): (passed, what was checked or the failure's line)."""
    with tempfile.TemporaryDirectory(prefix="convert-model-check-") as scratch:
        root = Path(scratch)
        for relative, text in files.items():
            (root / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / relative).write_text(text, encoding="utf-8")
        (root / "spec.json").write_text(json.dumps(spec(recipe, version, root, compare, classes)), encoding="utf-8")
        paths = [str(installs.REPO)]
        if install.directory is not None:
            paths.insert(0, str(install.directory))  # that release, and not the one a PYTHONPATH may name
        elif os.environ.get("PYTHONPATH"):
            paths.append(os.environ["PYTHONPATH"])
        hidden = {} if install.directory is None else installed.tokenizers_hidden(install.directory)
        env = {**os.environ, **hidden, "PYTHONPATH": os.pathsep.join(paths)}
        proc = subprocess.run([sys.executable, "-m", "converter.trace_check", str(root / "spec.json")],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    if proc.returncode == 0:
        return True, lines[0] if lines else ""
    return False, lines[0] if proc.returncode in (1, 2) and lines else (lines[-1] if lines else "no output")


def fx_check(mode: str, files: dict[PurePosixPath, str], recipe: Recipe, version: str, cache_dir: Path) -> None:
    """Build the generated classes and trace them with torch.fx on every path they keep.

    ``mode``: "never"; "always" (``--verify``: no torch or no install of this release is an
    error); "auto" (the default: run when torch and this release can be imported, else say why not).
    """
    if mode == "never":
        return
    install = locate(recipe.package, version, cache_dir) if _has_torch() else None
    if install is None:
        reason = "torch is not installed" if not _has_torch() else _not_installed(recipe.package, version)
        if mode == "always":
            raise UserError(f"--verify: {reason}")
        log.info("fx check skipped: %s (pass --verify to require it)", reason)
        return
    passed, line = run(files, recipe, version, install, compare=False)
    if not passed:
        raise UserError(f"fx check of the generated {recipe.family} {version} failed: {line}")
    log.info("fx check: every class traces with torch.fx, on every path it keeps (%s)", line)


def stock_check(files: dict[PurePosixPath, str], recipe: Recipe, version: str, cache_dir: Path) -> None:
    """An unverified release's output checked against its stock code, installing the release when needed."""
    if not _has_torch():
        raise UserError(f"{recipe.package} {version} is unverified and torch is not installed to check it",
                        hint=ACCEPT_HINT)
    install = locate(recipe.package, version, cache_dir)
    if install is None:
        release = installs.release_for(version, installs.verified_releases())
        root = installed.install_roots(recipe.package, cache_dir)[0]
        log.info("%s %s is unverified: installing it in %s to check the output against it", recipe.package,
                 version, root)
        try:
            installs.install(release, root)
        except (installs.InstallError, OSError) as exc:
            raise UserError(f"{recipe.package} {version} is unverified and cannot be installed to check the output "
                            f"against it: {exc}", hint=ACCEPT_HINT) from None
        install = Install(installs.install_dir(version, root), str(installs.install_dir(version, root)))
    passed, line = run(files, recipe, version, install, compare=True)
    if not passed:
        raise UserError(f"{recipe.package} {version} is unverified and its conversion fails the check against "
                        f"stock: {line}", hint=ACCEPT_HINT)
    log.info("%s %s is unverified: checked against its stock code (%s): every class equal to stock in eval and "
             "traces with torch.fx, on every path it keeps (%s)", recipe.package, version, install.where, line)


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _not_installed(package: str, version: str) -> str:
    try:
        installed = f"the installed {package} is {metadata.version(package)}"
    except metadata.PackageNotFoundError:
        installed = f"{package} is not installed"
    return f"{installed}, and no side-by-side install of {version} is here"
