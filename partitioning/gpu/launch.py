"""``partition-model --run``: train the plan under torchrun, one stage per process, and stop every rank after.

torchrun runs in its own session, so an interrupt of partition-model (Ctrl-C,
SIGTERM) stops it and every rank it started before partition-model exits, and
a rank's failure is one line: the rank's own error, else torchrun's summary.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from common.errors import UserError

TRAIN = "partitioning.gpu.train"  # the module each rank runs; its errors start with its name
# the lines of torchrun's failure summary that name a failed rank and its exit code (negative: a signal)
_RANK = re.compile(r"\s*rank\s*: (\d+) \(local_rank")
_EXITCODE = re.compile(r"\s*exitcode\s*: (-?\d+)(?: \(pid: (\d+)\))?")
_CLOSING = re.compile(r"Sending process (\d+) closing signal")  # torchrun stopping a rank itself (its log)
_REPORTED = re.compile(r".* \(rank (\d+)\): error: ")  # a rank's own one-line error
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_TRACEBACK = re.compile(r"\s*traceback\s*: (.*)")


def launch(plan: Path, stages: int, steps: int, timeline: Path | None = None, tied_sum: str = "ordered") -> None:
    """torchrun the plan's stages, streaming the steps the last stage prints; a failure is one line.
    ``timeline``: rank 0 writes the per-rank timeline of every step there; ``tied_sum``: as ``train-model``'s."""
    extra = ["--timeline", str(timeline.resolve())] if timeline is not None else []
    run_ranks(TRAIN, ["--plan", str(plan), "--steps", str(steps), "--tied-sum", tied_sum, *extra], stages)


def torchrun_command(module: str, arguments: list[str], ranks: int, nodes: int = 1, node_rank: int | None = None,
                     endpoint: str | None = None) -> list[str]:
    """``torchrun -m module arguments`` with ``ranks`` ranks on this machine: alone, or node ``node_rank`` of
    ``nodes`` meeting at ``endpoint`` (node 0's HOST:PORT; ranks numbered node by node)."""
    where = ["--standalone"] if nodes == 1 else [f"--nnodes={nodes}", f"--node-rank={node_rank}",
                                                  f"--rdzv-endpoint={endpoint}"]
    return [sys.executable, "-m", "torch.distributed.run", *where, f"--nproc-per-node={ranks}", "-m", module,
            *arguments]


def run_ranks(module: str, arguments: list[str], ranks: int, prog: str | None = None, *, nodes: int = 1,
              node_rank: int | None = None, endpoint: str | None = None) -> None:
    """``torchrun -m module arguments`` on ``ranks`` local ranks; each rank's errors start with ``prog (rank``."""
    # torchrun keeps its logs (and the ranks their temporaries) in a directory it never removes: give it one of ours.
    with tempfile.TemporaryDirectory(prefix="pipeline-run-") as scratch:
        command = torchrun_command(module, arguments, ranks, nodes, node_rank, endpoint)
        command[3:3] = ["--log-dir", scratch]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TMPDIR": scratch}
        _torchrun(command, env, prog or module)


# The ranks' progress lines the launcher prints (the rest of their output is torchrun's, kept for a failure).
RELAYED = ("step ", "saved step ", "loaded stage ")
_STEP = re.compile(r"step (\d+)/(\d+): (.*)")
_SHOWN = ("loss ", "lr ", "eval loss ")  # what of a step line the bar shows beside its rate and ETA


class Progress:
    """The relayed lines on the launcher's terminal: the step lines as one progress bar (tqdm: the step count,
    the rate, the time to go; the last loss and lr beside it), every other line above it.  Where the output is
    not a terminal (a file, a pipe, a CI log) every line is printed as it came, bar-free."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.terminal = stream.isatty()
        self.bar: tqdm | None = None

    def line(self, text: str) -> None:
        found = _STEP.match(text) if self.terminal else None
        if found is None:
            if self.bar is not None:
                self.bar.write(text, file=self.stream)
            else:
                print(text, file=self.stream, flush=True)
            return
        done, total = int(found[1]), int(found[2])
        if self.bar is None:  # a resumed run's first line is its first step, not 1
            self.bar = tqdm(total=total, initial=done - 1, file=self.stream, unit="step", dynamic_ncols=True)
        self.bar.set_postfix_str(", ".join(part for part in found[3].split(", ") if part.startswith(_SHOWN)),
                                 refresh=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _torchrun(command: list[str], env: dict[str, str], prog: str = TRAIN) -> None:
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                             start_new_session=True, preexec_fn=_stop_with_parent(os.getpid()))
    tail: list[str] = []
    reported: list[str] = []  # a rank's own one-line error says more than torchrun's summary; the first is the cause
    progress = Progress(sys.stdout)
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(RELAYED):
                progress.line(line.rstrip())
            if line.startswith(f"{prog} (rank ") and ": error: " in line:
                reported.append(line.rstrip())
            tail = (tail + [line.rstrip()])[-200:]  # torchrun's summary: about 8 lines per failed rank
        child.wait()
    finally:
        progress.close()
        if child.poll() is None:  # interrupted: stop torchrun and the ranks it started
            _stop(child)
        if child.stdout is not None:
            child.stdout.close()
    if child.returncode:
        raise UserError(f"the pipelined run failed (torchrun exit {child.returncode}): {_cause(reported, tail)}")


def _stop_with_parent(parent: int) -> Callable[[], None] | None:
    """What torchrun's process runs before it starts: SIGTERM to it when this process dies, however it dies.

    torchrun runs in its own session, so a SIGKILL of this process alone reaches neither it nor its ranks, which
    would train on; on SIGTERM torchrun stops its ranks.  Linux's PR_SET_PDEATHSIG (elsewhere: None, nothing)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # this process died before the line above: no signal will come
            os._exit(1)

    return arm


def _cause(reported: list[str], tail: list[str]) -> str:
    """Why the run failed. A rank killed by a signal cannot say so itself, and the errors its peers then report
    ("connection closed by peer") are consequences: the killed rank is the cause. torchrun's summary lists every
    rank with its exit code (negative: a signal) and pid, also those it stopped itself after the first failure,
    which its log names ("Sending process PID closing signal SIGTERM"): those are not a cause, whatever signal
    ended them (a rank stopped while it tears its process group down may abort); a SIGTERM it did not send is
    (someone stopped that rank), after any other signal.  Nor is the signal of a rank that had said its own error:
    it had failed before it died."""
    ranks = [int(found[1]) for line in tail if (found := _RANK.match(line))]
    exits = [(int(found[1]), found[2]) for line in tail if (found := _EXITCODE.match(line))]
    closed = {found[1] for line in tail if (found := _CLOSING.search(line))}
    said = {int(found[1]) for line in reported if (found := _REPORTED.match(line))}
    killed = sorted({(-code == signal.SIGTERM, rank, -code) for rank, (code, pid) in zip(ranks, exits, strict=False)
                     if code < 0 and pid not in closed and rank not in said})
    if killed:
        _, rank, signum = killed[0]
        try:
            return f"rank {rank} was killed by signal {signum} ({signal.Signals(signum).name})"
        except ValueError:  # a number no signal has here
            return f"rank {rank} was killed by signal {signum}"
    return reported[0] if reported else _failure(tail)


def _stop(child: subprocess.Popen[str]) -> None:
    for signum, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(child.pid, signum)  # torchrun's own session: it and the ranks it started
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _failure(tail: list[str]) -> str:
    """The line of torchrun's output that says why a rank failed (its summary names the rank and the cause)."""
    roots = [i for i, line in enumerate(tail) if line.startswith("Root Cause")]
    tail = tail[roots[-1]:] if roots else tail  # the first failure, not the ranks torchrun stopped because of it
    rank = next((found[1] for line in tail if (found := _RANK.match(line))), None)
    cause = next((found[1].strip() for line in tail if (found := _TRACEBACK.match(line))), None)
    if cause and "To enable traceback" not in cause:
        return f"rank {rank}: {cause}" if rank else cause
    code = next((found[1] for line in tail if (found := _EXITCODE.match(line))), None)
    if code:
        return f"rank {rank} exited with code {code}" if rank else f"a rank exited with code {code}"
    errors = [line for line in tail if "error" in line.lower()]
    return errors[-1] if errors else tail[-1] if tail else "no output"
