"""Shared fixtures: the committed source cache and a hermetic package index."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import shutil
import signal
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

pytest.register_assert_rewrite("support.transform_helpers")

from support.suite_release import put_first  # noqa: E402 (after the rewrite hook: it imports nothing it names)

put_first()  # before any test imports transformers: the suite's in-process release is 4.5.1

# A suite started in the background (``cmd &``, nohup) inherits SIGINT (and SIGHUP) ignored, and so would every
# process it starts: the tests that interrupt a command would see it ignore the signal.  Handled here, the signals
# reach those processes with their default action, as from a terminal.
for _signal in (signal.SIGINT, signal.SIGHUP):
    if signal.getsignal(_signal) == signal.SIG_IGN:
        signal.signal(_signal, signal.default_int_handler if _signal == signal.SIGINT else signal.SIG_DFL)

FIXTURES = Path(__file__).parent / "fixtures"
SOURCE_CACHE = FIXTURES / "cache"
T5_MEMBER = "transformers/models/t5/modeling_t5.py"
T5_SOURCE = SOURCE_CACHE / "transformers-4.5.1" / T5_MEMBER
REPO = Path(__file__).parent.parent

# The longest tests (each spawns processes for a minute or so) run first: with two xdist workers,
# one started last would leave the other core idle until it ends. pyproject.toml's --maxschedchunk
# makes xdist hand them out one by one as workers free up.
SLOW_FIRST = ("test_user_environment.py", "test_readme_quickstart.py", "test_first_use.py", "test_committed_packages.py", "test_seed_releases.py", "test_pipelining_four_ranks.py", "test_train_dp.py",
              "test_llm_releases.py", "test_train_model.py", "test_train_releases.py", "test_t5_releases.py",
              "test_llm_pipelining.py", "test_pipelining.py", "test_pipelining_schedules.py", "test_train_real_weights.py",
              "test_train_hostile.py", "test_train_text.py", "test_t5_tracing.py", "test_model_tracing.py",
              "test_heads.py", "test_real_weights.py", "test_train_chunks.py", "test_timeline.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: SLOW_FIRST.index(item.path.name) if item.path.name in SLOW_FIRST
               else len(SLOW_FIRST))  # stable: the rest keep their order


def load_script(name: str) -> ModuleType:
    """The module ``scripts/<name>.py`` (scripts/ is not a package), imported once."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        assert spec is not None and spec.loader is not None  # a .py file: the source loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # registered before it runs: dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture
def source_cache(tmp_path: Path) -> Path:
    """A writable copy of the committed source cache."""
    target = tmp_path / "cache"
    shutil.copytree(SOURCE_CACHE, target)
    return target


def build_wheel(path: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal but valid wheel: pip reads its METADATA before saving it."""
    dist_info = f"{name}-{version}.dist-info"
    files = dict(members)
    files[f"{dist_info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{dist_info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for member, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return wheel


class FakeIndex:
    """A PEP 503 index on disk, served to pip through file:// URLs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = root / "files"
        self.files.mkdir(parents=True)

    def add(self, version: str, members: dict[str, bytes], name: str = "transformers") -> Path:
        wheel = build_wheel(self.files, name, version, members)
        page = self.root / "simple" / name
        page.mkdir(parents=True, exist_ok=True)
        links = "".join(f'<a href="{w.as_uri()}">{w.name}</a>\n' for w in sorted(self.files.glob(f"{name}-*.whl")))
        (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
        return wheel

    @property
    def url(self) -> str:
        return (self.root / "simple").as_uri()


def isolate_pip(monkeypatch: pytest.MonkeyPatch, index_url: str) -> None:
    """Point pip at one index only, ignoring this machine's pip configuration."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", index_url)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "3")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")


def release_members() -> dict[str, bytes]:
    """The files of transformers 4.5.1 that the T5 recipe reads."""
    release = SOURCE_CACHE / "transformers-4.5.1"
    return {str(p.relative_to(release)): p.read_bytes() for p in release.rglob("*.py")}


@pytest.fixture
def fake_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeIndex:
    """An index holding transformers 4.5.1 with the real T5 files and nothing else."""
    index = FakeIndex(tmp_path / "index")
    index.add("4.5.1", release_members())
    isolate_pip(monkeypatch, index.url)
    return index


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="session")
def converted_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """convert-model's output for T5 4.5.1 from the committed cache, made once per session."""
    from converter.cli import main

    out = tmp_path_factory.mktemp("converted") / "out"
    assert main(["t5", "--version", "4.5.1", "--cache-dir", str(SOURCE_CACHE), "--from", "cache",
                 "--output-dir", str(out)]) == 0
    return out


@pytest.fixture
def out_dir(tmp_path: Path, converted_once: Path) -> Path:
    """An output dir holding a previous good conversion that must survive bad runs untouched."""
    out = tmp_path / "out"
    shutil.copytree(converted_once, out)
    return out
