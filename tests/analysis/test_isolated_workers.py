"""Worker processes kept for a flow run: results as in-process, reused, and a dead worker heals."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from denpex.analysis.batch import summarize_batch
from denpex.analysis.workers import IsolatedWorkers, WorkerDied
from denpex.evidence.discovery import DumpRef

GLOO = Path(__file__).resolve().parents[1] / "fixtures" / "gloo" / "withheld_one"
REFS = [DumpRef(str(GLOO), f"rank_{r}.pkl", r, (GLOO / f"rank_{r}.pkl").stat().st_size) for r in range(4)]


def _worker_pids(workers: IsolatedWorkers) -> set[int]:
    pool = workers._current()  # noqa: SLF001 (the test looks at the processes themselves)
    return set(pool._processes)  # noqa: SLF001


def test_workers_give_the_in_process_result_and_are_reused() -> None:
    workers = IsolatedWorkers(2)
    try:
        assert workers.summarize(REFS) == summarize_batch(REFS)
        first = _worker_pids(workers)
        assert os.getpid() not in first
        assert workers.summarize(REFS[:2]) == summarize_batch(REFS[:2])
        assert _worker_pids(workers) == first  # no new process per batch
    finally:
        workers.close()


def test_a_killed_worker_fails_its_batch_and_the_next_batch_gets_fresh_workers() -> None:
    workers = IsolatedWorkers(1)
    try:
        workers.summarize(REFS[:1])
        [pid] = _worker_pids(workers)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDied, match="rank_0.pkl"):
            workers.summarize(REFS)
        assert workers.summarize(REFS) == summarize_batch(REFS)
        assert pid not in _worker_pids(workers)
    finally:
        workers.close()


def test_warm_starts_every_worker_before_the_first_batch() -> None:
    workers = IsolatedWorkers(2)
    try:
        workers.warm()
        assert len(_worker_pids(workers)) == 2
        assert workers.summarize(REFS) == summarize_batch(REFS)
    finally:
        workers.close()
