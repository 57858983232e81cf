"""Worker processes kept for a flow run: results as in-process, reused, and a dead worker heals."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from denpex.analysis.batch import summarize_batch
from denpex.analysis.workers import IsolatedWorkers
from denpex.evidence.dump_ref import DumpRef

GLOO = Path(__file__).resolve().parents[1] / "fixtures" / "gloo" / "withheld_one"
REFS = [DumpRef(str(GLOO), f"rank_{r}.pkl", r, (GLOO / f"rank_{r}.pkl").stat().st_size) for r in range(4)]


def _worker_pids(workers: IsolatedWorkers) -> set[int]:
    return workers.worker_pids()


def test_workers_give_the_in_process_result_and_are_reused() -> None:
    workers = IsolatedWorkers(2)
    try:
        assert workers.summarize(REFS) == summarize_batch(REFS)
        first = _worker_pids(workers)
        assert os.getpid() not in first
        assert workers.summarize(REFS[:2]) == summarize_batch(REFS[:2])
        # No new process per batch: the first batch's workers are kept. Under load the pool may
        # have started only one of its two for the first batch and start the other now.
        second = _worker_pids(workers)
        assert first <= second and len(second) <= 2, (first, second)
    finally:
        workers.close()


def test_a_killed_worker_costs_its_batch_a_rerun_on_fresh_workers_not_the_batch() -> None:
    workers = IsolatedWorkers(1)
    try:
        workers.summarize(REFS[:1])
        [pid] = _worker_pids(workers)
        os.kill(pid, signal.SIGKILL)
        # The batch lands on the dead worker; it is run again, dump by dump, on a fresh one.
        assert workers.summarize(REFS) == summarize_batch(REFS)
        assert pid not in _worker_pids(workers)
        assert workers.summarize(REFS) == summarize_batch(REFS)
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


def _parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_summarize_all_runs_a_large_incident_on_forkserver_workers_with_the_in_process_result() -> None:
    """The CLI's pool is this same pool: its workers are the forkserver's children, never forks of
    the caller (a fork copies the caller's heap into every worker), and every ref gets its outcome."""
    from denpex.analysis import workers as pool_module

    many = [DumpRef(ref.store_uri, ref.name, rank, ref.size) for rank in range(64) for ref in REFS[rank % 4:rank % 4 + 1]]
    parents: dict[int, int] = {}
    real = pool_module.IsolatedWorkers.collect

    def spy(self: IsolatedWorkers, queued: pool_module.QueuedBatch) -> list:  # type: ignore[type-arg]
        outcomes = real(self, queued)
        parents.update({pid: _parent_of(pid) for pid in self.worker_pids()})
        return outcomes

    pool_module.IsolatedWorkers.collect = spy  # type: ignore[method-assign]
    try:
        done: list[tuple[int, int]] = []
        outcomes = pool_module.summarize_all(many, workers=2, progress=lambda d, n: done.append((d, n)))
    finally:
        pool_module.IsolatedWorkers.collect = real  # type: ignore[method-assign]
    in_process = summarize_batch(many)
    assert len(outcomes) == len(many)
    assert sorted(outcomes, key=lambda o: o.rank) == sorted(in_process, key=lambda o: o.rank)
    assert parents and os.getpid() not in parents
    assert os.getpid() not in set(parents.values()), parents
    assert done[-1] == (64, 64)
