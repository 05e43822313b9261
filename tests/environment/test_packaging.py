"""``pip install .`` gives working commands: the wheel holds every file of the packages the commands import,
their data included (the recipes, every committed generated_models package, the stateless runtime).

Files a package needs but setup.cfg's packages/package_data leave out would be missing from a user's install
only: the checkout imports them from the tree.  Built from a copy of the checkout (no build/ left here).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from user_venv import checkout_copy

PACKAGES = ("common", "families", "converter", "transforms", "stateless", "partitioning", "generated_models")


def test_the_wheel_holds_every_file_of_the_packages(tmp_path: Path) -> None:
    source = checkout_copy(tmp_path / "src")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path / "wheel"), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = (tmp_path / "wheel").glob("*.whl")
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in name}
    wanted = {path.relative_to(source).as_posix() for package in PACKAGES for path in (source / package).rglob("*")
              if path.is_file() and "__pycache__" not in path.parts}
    assert any(name.startswith("families/recipe_data/") for name in wanted)  # data, not only code
    assert sorted(wanted - shipped) == [] and sorted(shipped - wanted) == []
