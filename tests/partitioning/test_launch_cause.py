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


def test_the_ranks_torchrun_stopped_itself_are_not_the_cause() -> None:
    # torchrun stops the surviving ranks with SIGTERM and lists them too
    assert _cause([], _summary({0: -15, 1: -9})) == "rank 1 was killed by signal 9 (SIGKILL)"
    assert _cause([PEER], _summary({0: 1, 1: -15})) == PEER
