"""Where a family's generated code lives: one importable package per release under ``generated_models``."""

from __future__ import annotations

GENERATED = "generated_models"  # convert-model's default output root, an importable package


def version_dir(version: str) -> str:
    """The package name of one release (``4.5.1`` -> ``v4_5_1``)."""
    return "v" + version.replace(".", "_").replace("-", "_")


def generated_package(family: str, version: str) -> str:
    """The dotted name of the generated package of ``family`` at ``version``."""
    return f"{GENERATED}.{family}.{version_dir(version)}"
