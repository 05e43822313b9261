"""A backend ``partition-model`` plans for: ``--target gpu`` (:mod:`partitioning.gpu.target`) or ``ipu``.

The command itself (:mod:`partitioning.command`) is the same for every
target: it checks the request, costs the model, splits it and writes the plan.
A target adds its own flags, its checks (made before the slow costing), the
files it makes of a plan, and what runs once they are written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Protocol

from families.family import ModelFamily
from partitioning.plan import Plan
from partitioning.request import Request


class Target(Protocol):
    name: str  # the value of --target
    summary: str  # what it is, for --help

    @property
    def options(self) -> type[Any] | None:
        """The dataclass of its own flags (their dests are its fields; ``Request.options``), or None."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add its own flags to partition-model's parser."""

    def plan_file(self, request: Request) -> Path | None:
        """A plan file to place instead of making a plan, or None."""

    def check(self, request: Request, family: ModelFamily) -> Request:
        """Refuse what it cannot do before any costing; the request with stages, batch and costing settled."""

    def reads(self, request: Request) -> dict[str, Path | None]:
        """The files it reads, by the flag that names them (an output must not replace one)."""

    def writes(self, request: Request) -> dict[str, Path]:
        """The files it writes beside the plan, by the flag that names them."""

    def outputs(self, request: Request, plan: Plan) -> tuple[list[str], dict[Path, bytes]]:
        """The lines it reports for ``plan`` and the files it makes of it (nothing is written here)."""

    def run(self, request: Request) -> None:
        """What runs once every file is written."""
