"""Which failure a pipelined run reports, read from torchrun's own summary (formatted by torch's elastic errors)."""

from __future__ import annotations

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from partitioning.gpu.launch import _cause

PEER = "train-model (rank 0): error: internal error: RuntimeError: Connection closed by peer"


def _summary(codes: dict[int, int]) -> list[str]:
    """torchrun's failure summary for ranks that exited with ``codes`` (no error files: as after a signal)."""
    failures = {rank: ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="/nonexistent")
                for rank, code in codes.items()}
    return ChildFailedError("partitioning.train.rank", failures).format_msg().splitlines()


def test_a_rank_killed_by_a_signal_is_the_cause_not_the_peer_that_lost_it() -> None:
    # torchrun lists rank 0 first (equal timestamps): its "root cause" is the peer's consequence
    assert _cause([PEER], _summary({0: 1, 1: -9})) == "rank 1 was killed by signal 9 (SIGKILL)"
    assert _cause([PEER], _summary({1: -9})) == "rank 1 was killed by signal 9 (SIGKILL)"


def test_without_a_signal_the_ranks_own_line_is_the_cause() -> None:
    assert _cause([PEER], _summary({0: 1})) == PEER
    assert _cause([], _summary({2: 3})) == "rank 2 exited with code 3"


def _closing(rank: int) -> str:
    """torchrun's log line as it stops the rank itself (the pid _summary gives it)."""
    return (f"W1203 15:00:00.000000 999 torch/distributed/elastic/multiprocessing/api.py:1029] Sending process "
            f"{1000 + rank} closing signal SIGTERM")


def test_the_ranks_torchrun_stopped_itself_are_not_the_cause() -> None:
    # torchrun stops the surviving ranks with SIGTERM, logs it, and lists them too
    assert _cause([], [_closing(0), *_summary({0: -15, 1: -9})]) == "rank 1 was killed by signal 9 (SIGKILL)"
    assert _cause([PEER], [_closing(1), *_summary({0: 1, 1: -15})]) == PEER


def test_a_sigterm_torchrun_did_not_send_is_the_cause() -> None:
    # SIGTERM to rank 0 alone: rank 1 loses its peer and says so first; torchrun stopped nobody
    lost = "train-model (rank 1): error: internal error: RuntimeError: [gloo] Read error: Connection reset by peer"
    assert _cause([lost], _summary({0: -15, 1: 2})) == "rank 0 was killed by signal 15 (SIGTERM)"
    # any other signal is the likelier cause
    assert _cause([], _summary({0: -15, 1: -9})) == "rank 1 was killed by signal 9 (SIGKILL)"


def test_a_rank_torchrun_stopped_is_not_the_cause_whatever_signal_ended_it() -> None:
    # both ranks stop on the same error; rank 0 exits first, torchrun stops rank 1, which aborts in its teardown
    nan = "train-model (rank 0): error: step 1: the loss is NaN"
    assert _cause([nan], [_closing(1), *_summary({0: 2, 1: -6})]) == nan


def test_a_rank_that_said_its_error_before_a_signal_ended_it_is_its_own_cause() -> None:
    said = "train-model (rank 1): error: step 1: the loss is NaN"
    assert _cause([said], _summary({0: 2, 1: -6})) == said
    # a rank that said nothing and was killed is still the cause over its peer's line
    assert _cause([said], _summary({0: -9, 1: 2})) == "rank 0 was killed by signal 9 (SIGKILL)"
