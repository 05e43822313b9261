"""common/atomic.py, the writer both CLIs use: all or nothing under failures, real signals and crashes.

Signals are real: a child process runs a write and sends itself the signal at
an exact step (after the N-th fsync while staging, after the N-th rename while
committing), then the test inspects what is on disk.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from common.atomic import is_temporary, recover, write_all_atomic, write_atomic

OLD = {"a.txt": b"old a", "sub/b.txt": b"old b"}
NEW = {"a.txt": b"new a", "sub/b.txt": b"new b", "sub/deeper/c.txt": b"new c", "d.txt": b"new d"}

# A child that writes NEW over OLD and sends itself `signum` right after the `at`-th file is staged
# ("stage") or renamed over its target ("commit"); the journal's own staging and rename are not counted.
DRIVER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from common import atomic
    root, phase, signum, at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    owner, name = (atomic, "write_file") if phase == "stage" else (os, "replace")
    real, calls = getattr(owner, name), []
    def hooked(first, second):
        result = real(first, second)
        if ".atomic-write." not in str(first):
            calls.append(first)
            if len(calls) == at:
                os.kill(os.getpid(), signum)
        return result
    setattr(owner, name, hooked)
    try:
        atomic.write_all_atomic({root / k: v.encode() for k, v in %r.items()}, root=root)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        print(exc, file=sys.stderr)
        sys.exit(3)
""" % {k: v.decode() for k, v in NEW.items()})


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file and directory under root (directories map to None)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def make_old(root: Path) -> dict[str, bytes | None]:
    for rel, data in OLD.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return tree(root)


def leftovers(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if is_temporary(p.name)]


def run_driver(root: Path, phase: str, signum: int, at: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]]))
    return subprocess.run([sys.executable, "-c", DRIVER, str(root), phase, str(signum), str(at)],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("phase,at", [("stage", 1), ("stage", 3), ("commit", 1), ("commit", 3)],
                         ids=["staging-1st", "staging-3rd", "renaming-after-1st", "renaming-after-3rd"])
@pytest.mark.parametrize("signum,returncode", [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM),
                                               (signal.SIGHUP, -signal.SIGHUP)], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_signal_mid_write_leaves_the_old_files(tmp_path: Path, phase: str, at: int, signum: int,
                                                 returncode: int) -> None:
    before = make_old(tmp_path)
    proc = run_driver(tmp_path, phase, signum, at)
    assert proc.returncode == returncode, proc.stderr
    # Rolled back, then the signal acted (KeyboardInterrupt, or death by the default action).
    assert tree(tmp_path) == before
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("phase,at", [("stage", 2), ("stage", 4), ("commit", 1), ("commit", 3)],
                         ids=["staging", "staged-all", "renamed-1st", "renamed-3rd"])
def test_a_crash_mid_write_is_rolled_back_by_the_next_run(tmp_path: Path, phase: str, at: int) -> None:
    before = make_old(tmp_path)
    proc = run_driver(tmp_path, phase, signal.SIGKILL, at)
    assert proc.returncode == -signal.SIGKILL
    if phase == "commit":
        assert tree(tmp_path) != before  # the crash really split the write: some files are new
    recover(tmp_path)  # what the next convert-model run does before it reads the output directory
    assert tree(tmp_path) == before
    assert leftovers(tmp_path) == []
    write_all_atomic({tmp_path / k: v for k, v in NEW.items()}, root=tmp_path)
    assert {k: v for k, v in tree(tmp_path).items() if v is not None} == {**OLD, **NEW}


def test_the_next_write_rolls_back_by_itself(tmp_path: Path) -> None:
    before = make_old(tmp_path)
    assert run_driver(tmp_path, "commit", signal.SIGKILL, 3).returncode == -signal.SIGKILL
    write_all_atomic({tmp_path / "a.txt": b"third"}, root=tmp_path)  # recovers first, then writes
    assert tree(tmp_path) == {**before, "a.txt": b"third"}
    assert leftovers(tmp_path) == []


def test_a_directory_in_the_way_changes_nothing(tmp_path: Path) -> None:
    make_old(tmp_path)
    (tmp_path / "d.txt").mkdir()
    before = tree(tmp_path)
    with pytest.raises(IsADirectoryError):
        write_all_atomic({tmp_path / k: v for k, v in NEW.items()})
    assert tree(tmp_path) == before
    assert leftovers(tmp_path) == []


def test_a_rename_that_fails_midway_is_undone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = make_old(tmp_path)
    real, calls = os.replace, []

    def third_rename_fails(src, dst):
        calls.append(dst)
        if len(calls) == 4:  # journal, then a.txt, sub/b.txt, then this one
            raise PermissionError(13, "Permission denied", str(dst))
        return real(src, dst)
    monkeypatch.setattr(os, "replace", third_rename_fails)
    with pytest.raises(PermissionError):
        write_all_atomic({tmp_path / k: v for k, v in NEW.items()}, root=tmp_path)
    monkeypatch.undo()
    assert tree(tmp_path) == before
    assert leftovers(tmp_path) == []


def test_write_atomic_removes_its_temporary_when_the_rename_fails(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "plan.json"

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", str(dst))
    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(PermissionError):
        write_atomic(target, b"{}")
    assert list(tmp_path.iterdir()) == []


def test_write_atomic_refuses_a_directory_target_before_writing(tmp_path: Path) -> None:
    (tmp_path / "plan.json").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "plan.json", b"{}")
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    from pathlib import Path
    from common.atomic import write_all_atomic
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG, like ENOSPC
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
    root = Path(sys.argv[1])
    try:
        write_all_atomic({root / "new/deep/small": b"x", root / "new/deep/big": b"y" * 5000, root / "a.txt": b"z"},
                         root=root)
    except OSError as exc:
        print(exc.errno, file=sys.stderr)
        sys.exit(3)
""")


def test_a_full_disk_leaves_no_file_and_no_empty_directory(tmp_path: Path) -> None:
    before = make_old(tmp_path)
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]])), timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert tree(tmp_path) == before  # no new/, no new/deep/


def test_dead_writers_temporaries_are_removed_live_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".a.txt.{dead}.0123abcd.tmp"
    mine = tmp_path / f".a.txt.{os.getpid()}.0123abcd.tmp"
    user = tmp_path / ".a.txt.notours.tmp"
    for path in (stale, mine, user):
        path.write_bytes(b"partial")
    write_atomic(tmp_path / "a.txt", b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["a.txt", mine.name, user.name])


def test_a_journal_cannot_reach_outside_its_directory(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    inner = tmp_path / "out"
    inner.mkdir()
    (inner / ".atomic-write.999999999.journal").write_text(
        '{"entries": [{"target": "../victim.txt", "temp": "../.victim.txt.999999999.0123abcd.tmp", '
        '"backup": null}], "created": []}')
    recover(inner)
    assert victim.read_bytes() == b"precious"
    assert list(inner.iterdir()) == []


CONCURRENT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from common.atomic import write_all_atomic
    root, tag = Path(sys.argv[1]), sys.argv[2]
    for i in range(40):
        write_all_atomic({root / name: f"{tag} {i}".encode() for name in ("a", "b/c", "b/d/e")}, root=root)
""")


def test_concurrent_writers_never_mix_their_files(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]]))
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT, str(tmp_path), tag], env=env) for tag in "xy"]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    contents = {(tmp_path / name).read_text() for name in ("a", "b/c", "b/d/e")}
    assert contents in ({"x 39"}, {"y 39"})  # the last writer's three files, not a mix
    assert leftovers(tmp_path) == []


def test_new_files_get_the_umask_mode(tmp_path: Path) -> None:
    mask = os.umask(0o027)
    try:
        write_all_atomic({tmp_path / "a": b"1", tmp_path / "b": b"2"})
    finally:
        os.umask(mask)
    assert {oct((tmp_path / n).stat().st_mode & 0o777) for n in "ab"} == {oct(0o640)}


def test_a_write_from_another_thread_works_without_holding_signals(tmp_path: Path) -> None:
    import threading
    finished: list[bool] = []

    def write() -> None:
        write_all_atomic({tmp_path / "a": b"1", tmp_path / "b": b"2"})
        finished.append(True)  # not reached if the write raised in the thread

    thread = threading.Thread(target=write)
    thread.start()
    thread.join()
    assert finished == [True] and (tmp_path / "b").read_bytes() == b"2"


def test_targets_outside_the_journal_directory_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_all_atomic({tmp_path / "a": b"1", tmp_path.parent / "b": b"2"}, root=tmp_path)
    assert not (tmp_path / "a").exists()
