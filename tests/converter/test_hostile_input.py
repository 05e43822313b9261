"""convert-model under hostile and careless input (issue 14, converter side): one line, exit 2, nothing half-written.

Each test reproduces one case a new user ran into; the comment says what happened before.
Cases whose cause was inside a transform say what happened before the fix in a comment.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import SOURCE_CACHE, T5_MEMBER, T5_SOURCE, FakeIndex, release_members, snapshot
from test_cli import assert_rejected, convert, one_error_line

from common.atomic import is_temporary
from converter import convert_one
from converter.cli import main
from converter.fetch import Fetcher
from converter.recipes import get_recipe

SUPPORT_MEMBER = "transformers/modeling_utils.py"
MANIFEST = "transformers-4.5.1/manifest.json"
INTERRUPTED = "convert-model: interrupted"


def _command(args: tuple[str, ...], hook: str = "") -> list[str]:
    """convert-model's console entry in a child process; ``hook`` is Python run first (to send a real signal)."""
    code = f"import sys\n{hook}\nfrom converter.__main__ import main\nsys.exit(main())\n"
    return [sys.executable, "-c", code, *args]


def convert_model(*args: str, hook: str = "", preexec: Callable[[], None] | None = None
                  ) -> subprocess.CompletedProcess[str]:
    """Run convert-model to the end."""
    return subprocess.run(_command(args, hook), capture_output=True, text=True, preexec_fn=preexec, timeout=300)


def start_convert_model(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """Start convert-model and leave it running."""
    return subprocess.Popen(_command(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if is_temporary(p.name)]


# -- one line instead of a traceback ---------------------------------------------------------------------------

def big_sparse_file(tmp_path: Path) -> Path:
    path = tmp_path / "huge_modeling_t5.py"
    with open(path, "wb") as handle:
        handle.truncate(17 * 1024 * 1024)
    return path


def latin1_file(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.py"
    path.write_bytes(b"# caf\xe9\n")
    return path


@pytest.mark.parametrize("make,expected", [
    (lambda tmp: Path("/dev/zero"), "not a regular file"),  # before: MemoryError traceback
    (big_sparse_file, "too large for a source file"),
    (lambda tmp: tmp, "is a directory"),
    (latin1_file, "is not UTF-8"),
], ids=["dev-zero", "17MiB", "directory", "not-utf8"])
def test_every_read_of_a_source_file_is_capped(tmp_path: Path, out_dir: Path, capsys, make, expected: str) -> None:
    source = make(tmp_path)
    assert_rejected(convert("--source-file", str(source), "--output-dir", str(out_dir)), out_dir, capsys, expected)


def test_source_dir_with_a_device_for_a_file_is_refused(tmp_path: Path, out_dir: Path, capsys) -> None:
    tree = tmp_path / "src"
    (tree / T5_MEMBER).parent.mkdir(parents=True)
    shutil.copy(T5_SOURCE, tree / T5_MEMBER)
    (tree / SUPPORT_MEMBER).symlink_to("/dev/zero")
    assert_rejected(convert("--source-dir", str(tree), "--output-dir", str(out_dir)), out_dir, capsys,
                    "not a regular file")


MALFORMED_MANIFESTS = {
    "list": "[1, 2]",
    "list-of-members": json.dumps([T5_MEMBER, SUPPORT_MEMBER]),  # before: TypeError traceback
    "number": "5",  # before: TypeError traceback
    "string": '"x"',
    "bad-hashes": json.dumps({T5_MEMBER: 5}),
    "not-json": "{bad",
    "directory": None,
    "2MiB": json.dumps({"x": "0" * 64, "pad": "y" * (2 << 20)}),
}


def break_manifest(cache: Path, kind: str) -> Path:
    manifest = cache / MANIFEST
    manifest.unlink()
    text = MALFORMED_MANIFESTS[kind]
    if text is None:
        manifest.mkdir()
    else:
        manifest.write_text(text)
    return manifest


@pytest.mark.parametrize("kind", MALFORMED_MANIFESTS)
def test_a_malformed_cache_manifest_is_an_empty_cache(kind: str, source_cache: Path, out_dir: Path, capsys) -> None:
    break_manifest(source_cache, kind)
    before = snapshot(out_dir)
    assert main(convert("--from", "cache", "--output-dir", str(out_dir), cache=source_cache)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "cache manifest" in err and "ignoring the cache" in err
    assert err.strip().splitlines()[-1].startswith("convert-model: error: transformers 4.5.1: ")
    assert snapshot(out_dir) == before


def test_a_manifest_that_is_a_directory_leaves_no_temporary(tmp_path: Path, source_cache: Path,
                                                             fake_index: FakeIndex, converted_once: Path,
                                                             capsys) -> None:
    break_manifest(source_cache, "directory")
    assert main(convert("--output-dir", str(tmp_path / "out"), cache=source_cache)) == 0
    assert "could not write cache" in capsys.readouterr().err
    assert snapshot(tmp_path / "out") == snapshot(converted_once)
    assert leftovers(source_cache) == []  # before: a .manifest.json.*.tmp left behind


CTRL_C_AT_IMPORT = textwrap.dedent("""
    import os, signal
    target = sys.argv.pop(1)
    def _interrupt(event, args):
        if event == "import" and args[0] == target and not getattr(_interrupt, "done", False):
            _interrupt.done = True
            os.kill(os.getpid(), signal.SIGINT)
    sys.addaudithook(_interrupt)
""")


@pytest.mark.parametrize("module", ["converter.cli", "converter.fetch", "libcst", "transforms", "converter.pipeline"])
def test_ctrl_c_while_importing_is_one_line(module: str, tmp_path: Path) -> None:
    """A real SIGINT while the entry point imports ``module`` (the first ~0.6 s). Before: a traceback."""
    proc = convert_model(module, *convert("--from", "cache", "--output-dir", str(tmp_path / "out")),
                         hook=CTRL_C_AT_IMPORT)
    assert (proc.returncode, proc.stderr) == (2, INTERRUPTED + "\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [
    ["t5", "--version"],
    ["t5", "--version", "4.5.1", "--bogus"],
    ["t5", "--version", "4.5.1", "--from", "nowhere"],
    ["t5", "--version", "4.5.1", "--check", "--diff"],
    ["t5", "--version", "4.5.1", "--source-file", "a.py", "--source-dir", "b"],
    ["t5", "--version", "4.5.1", "--output-dir", ""],  # before: wrote into the current directory
    ["t5", "--version", "4.5.1", "--cache-dir", ""],
    ["t5", "--version", "4.5.1", "--source-file", " "],
], ids=["missing-value", "unknown-option", "bad-choice", "exclusive-modes", "exclusive-sources",
        "empty-output-dir", "empty-cache-dir", "blank-source-file"])
def test_usage_errors_are_one_line(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "__init__.py").write_text("# the user's own package\n")
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1  # before: 7 lines (usage + error)
    assert captured.err.startswith("convert-model: error: ") and "--help" in captured.err
    assert snapshot(tmp_path) == {"__init__.py": b"# the user's own package\n"}


def test_help_and_version_still_exit_0(capsys) -> None:
    assert main(["--help"]) == 0
    assert main(["-V"]) == 0
    assert "convert-model 0." in capsys.readouterr().out


def test_an_unexpected_exception_is_one_line_with_a_hint(tmp_path: Path, capsys, monkeypatch) -> None:
    """A bug anywhere in the conversion (here a fault injected into rendering) is one line, not a traceback."""
    def broken(*_: object) -> None:
        raise RuntimeError("injected fault")

    monkeypatch.setattr(convert_one, "render", broken)
    args = convert("--from", "cache", "--output-dir", str(tmp_path / "out"))
    assert main(args) == 2
    line = one_error_line(capsys)
    assert "internal error" in line and "rerun with -v" in line and "injected fault" in line
    assert main([*args, "-v"]) == 2
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# -- the output directory ------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [[], ["--check"]], ids=["write", "check"])
def test_an_output_dir_that_is_a_file_is_an_error(mode: list[str], tmp_path: Path, capsys) -> None:
    target = tmp_path / "a_file"
    target.write_text("mine\n")
    assert main(convert("--from", "cache", "--output-dir", str(target), *mode)) == 2
    assert "is not a directory" in one_error_line(capsys)  # before (--check): exit 1 and "missing:" lines
    assert capsys.readouterr().out == ""
    assert target.read_text() == "mine\n"


def test_an_output_dir_name_too_long_is_one_line(tmp_path: Path, capsys) -> None:
    too_long = tmp_path / ("x" * 300) / "out"
    assert main(convert("--from", "cache", "--output-dir", str(too_long))) == 2
    line = one_error_line(capsys)  # before: an OSError traceback (ENAMETOOLONG from Path.exists)
    assert "File name too long" in line and "internal error" not in line


def test_output_dir_dot_does_not_replace_the_users_init(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "__init__.py").write_text("# the user's own package\n")
    assert main(convert("--from", "cache", "--output-dir", ".")) == 2
    assert "refusing to replace __init__.py" in one_error_line(capsys)
    assert snapshot(tmp_path) == {"__init__.py": b"# the user's own package\n"}


@pytest.mark.parametrize("obstacle,expected", [
    ("t5", "is in the way"),
    ("t5/v4_5_1/modeling_t5.py/", "is a directory where a generated file goes"),
], ids=["file-for-a-directory", "directory-for-a-file"])
def test_the_layout_is_checked_before_anything_is_written(obstacle: str, expected: str, out_dir: Path,
                                                          capsys) -> None:
    path = out_dir / obstacle.rstrip("/")
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.mkdir() if obstacle.endswith("/") else path.write_text("in the way\n")
    # before (directory-for-a-file): 3 of 4 files replaced and a .tmp left
    assert_rejected(convert("--from", "cache", "--output-dir", str(out_dir)), out_dir, capsys, expected)
    assert leftovers(out_dir) == []


def test_check_accepts_any_spelling_of_the_output_dir(out_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys) -> None:
    monkeypatch.chdir(out_dir.parent)  # converted_once wrote it under another, absolute path
    spelling = f"./{out_dir.name}/../{out_dir.name}/"
    assert main(convert("--check", "--from", "cache", "--output-dir", spelling)) == 0, capsys.readouterr().out
    # before: the header embedded the --output-dir spelling, an absolute path in committed files
    header = (out_dir / "t5/v4_5_1/modeling_t5.py").read_text().split("\n\n")[0]
    assert str(out_dir) not in header and "--output-dir" not in header


def test_check_reports_an_extra_file_in_the_generated_package(out_dir: Path, capsys) -> None:
    package = out_dir / "t5/v4_5_1"
    (package / "stale_module.py").write_text("x = 1\n")
    (package / "__pycache__").mkdir()
    (package / "__pycache__/modeling_t5.cpython-311.pyc").write_bytes(b"\0")
    (out_dir / "other_family_notes.txt").write_text("outside the package: not ours to judge\n")
    assert main(convert("--check", "--from", "cache", "--output-dir", str(out_dir))) == 1  # before: 0
    out = capsys.readouterr().out
    assert out.strip().splitlines() == [f"extra: {package / 'stale_module.py'}"]


def test_a_symlinked_output_dir_is_followed(out_dir: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(out_dir)
    assert main(convert("--check", "--from", "cache", "--output-dir", str(link))) == 0


def test_a_symlinked_target_to_a_users_file_is_not_replaced(out_dir: Path, tmp_path: Path, capsys) -> None:
    mine = tmp_path / "mine.py"
    mine.write_text("# the user's file\n")
    (out_dir / "t5/__init__.py").unlink()
    (out_dir / "t5/__init__.py").symlink_to(mine)
    assert_rejected(convert("--from", "cache", "--output-dir", str(out_dir)), out_dir, capsys, "refusing to replace")
    assert mine.read_text() == "# the user's file\n"


# -- the cache and local sources are verified against the recipe's pins ---------------------------------------

def tamper_with_manifest(cache: Path, member: str) -> Path:
    """Change a cached file and its manifest entry together, as a poisoned cache would."""
    cached = cache / "transformers-4.5.1" / member
    cached.write_bytes(cached.read_bytes() + b"\nimport os  # poisoned\n")
    manifest = json.loads((cache / MANIFEST).read_text())
    manifest[member] = hashlib.sha256(cached.read_bytes()).hexdigest()
    (cache / MANIFEST).write_text(json.dumps(manifest))
    return cached


@pytest.mark.parametrize("member", [T5_MEMBER, SUPPORT_MEMBER], ids=["modeling_t5", "modeling_utils"])
def test_a_poisoned_cache_entry_is_never_used(member: str, source_cache: Path, out_dir: Path, capsys) -> None:
    # before: converted (modeling_t5: with a warning; modeling_utils: silently)
    tamper_with_manifest(source_cache, member)
    before = snapshot(out_dir)
    assert main(convert("--from", "cache", "--output-dir", str(out_dir), cache=source_cache)) == 2
    err = capsys.readouterr().err
    assert f"is not transformers 4.5.1's {member}" in err and "tampered" in err
    assert "Traceback" not in err
    assert snapshot(out_dir) == before


def test_a_poisoned_support_file_is_refetched_and_the_cache_repaired(tmp_path: Path, source_cache: Path,
                                                                     fake_index: FakeIndex, converted_once: Path,
                                                                     capsys) -> None:
    cached = tamper_with_manifest(source_cache, SUPPORT_MEMBER)  # before: used without a word
    assert main(convert("--output-dir", str(tmp_path / "out"), cache=source_cache)) == 0
    assert "tampered; refetching" in capsys.readouterr().err
    assert cached.read_bytes() == release_members()[SUPPORT_MEMBER]
    manifest = json.loads((source_cache / MANIFEST).read_text())
    assert manifest[SUPPORT_MEMBER] == hashlib.sha256(cached.read_bytes()).hexdigest()
    assert snapshot(tmp_path / "out") == snapshot(converted_once)


def test_source_dir_with_a_patched_support_file_warns_and_pins(tmp_path: Path, capsys) -> None:
    tree = tmp_path / "src"
    for member, data in release_members().items():
        (tree / member).parent.mkdir(parents=True, exist_ok=True)
        (tree / member).write_bytes(data)
    patched = tree / SUPPORT_MEMBER
    patched.write_text(patched.read_text().replace("* -10000.0", "* -1e9"))
    out = tmp_path / "out"
    assert main(convert("--source-dir", str(tree), "--from", "cache", "--output-dir", str(out))) == 0
    # before: silent, and the regenerate line did not pin --source-dir
    assert f"{patched} differs from transformers 4.5.1's {SUPPORT_MEMBER}" in capsys.readouterr().err
    header = (out / "t5/v4_5_1/modeling_t5.py").read_text().split("\n\n")[0]
    assert "# regenerate: convert-model t5 --version 4.5.1 --source-dir SOURCE_DIR" in header
    assert f"# support: {SUPPORT_MEMBER} sha256 {hashlib.sha256(patched.read_bytes()).hexdigest()}" in header
    assert str(tmp_path) not in header


@pytest.mark.parametrize("version,expected", [
    ("04.5.1", "malformed version"),
    ("4.5.1.0", "version 4.5.1.0 is release 4.5.1 spelled differently"),
    (" 4.5.1", "malformed version"),
    ("4.5.1\n", "malformed version"),
    ("4" * 300, "malformed version"),
])
def test_odd_versions(version: str, expected: str, out_dir: Path, capsys) -> None:
    assert_rejected(["t5", "--version", version, "--from", "cache", "--cache-dir", str(SOURCE_CACHE),
                     "--output-dir", str(out_dir)], out_dir, capsys, expected)


def test_a_version_pip_matches_to_another_release_is_refused(tmp_path: Path, fake_index: FakeIndex,
                                                             out_dir: Path, capsys) -> None:
    fake_index.add("4.6.0", release_members())
    # pip download transformers==4.6 fetches 4.6.0: files of 4.6.0 must not be labelled 4.6
    args = ["t5", "--version", "4.6", "--cache-dir", str(tmp_path / "c"), "--from", "registry",
            "--output-dir", str(out_dir)]
    line = assert_rejected(args, out_dir, capsys, "answers transformers==4.6 with release 4.6.0")
    assert "--version 4.6.0" in line


# -- signals, crashes, full disks and neighbours ------------------------------------------------------------

def old_output(out_dir: Path) -> dict[str, bytes]:
    """Make the output dir stale (still generated files), so that a run has all four files to rewrite."""
    for path in out_dir.rglob("*.py"):
        path.write_text(path.read_text() + "# stale\n")
    return snapshot(out_dir)


SIGNAL_AT_RENAME = textwrap.dedent("""
    import os
    _signum, _at = int(sys.argv.pop(1)), int(sys.argv.pop(1))
    _real, _renamed = os.replace, []
    def _replace(src, dst):
        _real(src, dst)
        if ".atomic-write." not in str(dst):
            _renamed.append(dst)
            if len(_renamed) == _at:
                os.kill(os.getpid(), _signum)
    os.replace = _replace
""")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_while_renaming_leaves_the_old_output(signum: int, out_dir: Path) -> None:
    # before: a mix of old and new files, and temporaries the next run never removed
    before = old_output(out_dir)
    proc = convert_model(str(int(signum)), "2", *convert("--from", "cache", "--output-dir", str(out_dir)),
                         hook=SIGNAL_AT_RENAME)
    assert (proc.returncode, proc.stderr.strip().splitlines()[-1]) == (2, INTERRUPTED), proc.stderr
    assert "Traceback" not in proc.stderr
    assert snapshot(out_dir) == before


def test_a_crash_while_renaming_is_rolled_back_by_the_next_run(out_dir: Path, capsys) -> None:
    before = old_output(out_dir)
    proc = convert_model(str(int(signal.SIGKILL)), "2", *convert("--from", "cache", "--output-dir", str(out_dir)),
                         hook=SIGNAL_AT_RENAME)
    assert proc.returncode == -signal.SIGKILL
    assert leftovers(out_dir)  # the journal and the staged files of the dead run
    assert main(convert("--check", "--from", "cache", "--output-dir", str(out_dir))) == 1
    assert snapshot(out_dir) == before  # rolled back: all old, nothing left over
    assert "extra:" not in capsys.readouterr().out


def test_sigterm_during_pip_download_leaves_no_temporary_directory(tmp_path: Path, fake_index: FakeIndex) -> None:
    # A registry that accepts connections and never answers keeps pip waiting.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, PIP_INDEX_URL=f"http://127.0.0.1:{server.getsockname()[1]}/simple", PIP_TIMEOUT="120",
               TMPDIR=str(scratch))
    proc = start_convert_model(*convert("--from", "registry", "--output-dir", str(tmp_path / "out"),
                                        cache=tmp_path / "cache"), env=env)
    try:
        deadline = time.monotonic() + 120
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert accepted, "pip never reached the registry"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        server.close()
    assert (proc.returncode, err.strip().splitlines()[-1]) == (2, INTERRUPTED), err
    assert list(scratch.iterdir()) == []  # before: a convert-model-* directory (and pip's own) leaked


def test_a_full_disk_leaves_no_file_and_no_directory(tmp_path: Path) -> None:
    import resource

    def small_files() -> None:  # writes past 30 kB fail with EFBIG, as they would with ENOSPC
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, 30_000))
    proc = convert_model(*convert("--from", "cache", "--output-dir", str(tmp_path / "out")), preexec=small_files)
    assert proc.returncode == 2, proc.stderr
    assert "cannot write to output directory" in proc.stderr.strip().splitlines()[-1]
    assert list(tmp_path.iterdir()) == []  # before: empty directories left


def test_concurrent_runs_on_one_output_dir(tmp_path: Path, converted_once: Path) -> None:
    out = tmp_path / "out"
    runs = [start_convert_model(*convert("--from", "cache", "--output-dir", str(out))) for _ in range(2)]
    results = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], results
    assert snapshot(out) == snapshot(converted_once)
    assert leftovers(out) == []


def test_an_unwritable_cache_costs_only_a_warning(tmp_path: Path, fake_index: FakeIndex, caplog) -> None:
    blocker = tmp_path / "cache_is_a_file"
    blocker.write_text("")
    fetched = Fetcher("transformers", "4.5.1", blocker, "auto", get_recipe("t5").pins["4.5.1"]).fetch(
        (T5_MEMBER, SUPPORT_MEMBER))
    assert {m: s.origin for m, s in fetched.items()} in ({T5_MEMBER: "registry", SUPPORT_MEMBER: "registry"},
                                                         {T5_MEMBER: "installed", SUPPORT_MEMBER: "installed"})
    assert "could not write cache" in caplog.text
    assert blocker.read_text() == ""


# -- cases whose root cause is inside a transform (for the transform owner) -----------------------------------

def test_stub_classes_get_a_diagnosis_not_an_internal_error(tmp_path: Path, capsys) -> None:
    stubs = tmp_path / "stubs.py"
    stubs.write_text("class T5Model: ...\nclass T5ForConditionalGeneration: ...\nclass T5EncoderModel: ...\n")
    assert main(convert("--from", "cache", "--source-file", str(stubs), "--output-dir", str(tmp_path / "out"))) == 2
    assert "internal error" not in one_error_line(capsys)


def test_stub_classes_with_pass_bodies_are_refused(tmp_path: Path, capsys) -> None:
    stubs = tmp_path / "stubs.py"
    classes = ("T5Model", "T5ForConditionalGeneration", "T5EncoderModel")
    stubs.write_text("from torch import nn\n\n" + "".join(f"class {c}(nn.Module):\n    pass\n\n" for c in classes))
    assert main(convert("--from", "cache", "--source-file", str(stubs), "--output-dir", str(tmp_path / "out"))) == 2
    one_error_line(capsys)
    assert not (tmp_path / "out").exists()


# Before: exit 0 and a model whose forward raises TypeError (the weight passed to a stack that does not take it).
def test_a_source_with_the_stack_renamed_is_refused(tmp_path: Path, capsys) -> None:
    renamed = tmp_path / "modeling_t5.py"
    renamed.write_text(T5_SOURCE.read_text().replace("T5Stack", "RenamedStack"))
    assert main(convert("--from", "cache", "--source-file", str(renamed), "--output-dir", str(tmp_path / "out"))) == 2
    assert "T5Stack" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()
