"""Worker processes that decode untrusted dumps: the one process pool of the parse fan-out.

Two callers share it. ``summarize_all`` (the CLI and ``triage_path``) sends every batch of a large
incident at once. A flow run's parse tasks run batches on threads (a Prefect task runner) and send
each to ``IsolatedWorkers.summarize``, so batches use every core instead of queueing on the GIL.
Either way each decode gets the per-process memory budget. Workers come from a forkserver, so they never inherit the caller's threads or locks, and
they are started once: a process per batch paid the interpreter's start and the caller's
main-module import every time (most of a small incident's parse time).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from types import TracebackType
from typing import NamedTuple

from denpex.analysis.batch import (
    DEFAULT_MAX_DUMP_BYTES,
    RankOutcome,
    split_batches,
    summarize_batch,
    summarize_in_worker,
    worker_init,
)
from denpex.analysis.lanes import LaneKilled, Lanes
from denpex.evidence.cpu_budget import DEFAULT_CPU_BUDGET, CpuBudget
from denpex.evidence.dump_ref import DumpRef
from denpex.evidence.skipped import SkippedFile
from denpex.evidence.store import EvidenceStore

__all__ = ["IsolatedWorkers", "QueuedBatch", "Progress", "summarize_all", "usable_cpus"]

# Below this many dumps, starting worker processes costs more than it saves.
_POOL_THRESHOLD = 64

# Told (dumps done, dumps in all) as batches finish: a long triage can show its progress.
Progress = Callable[[int, int], None]

# Modules the forkserver imports once, so that each worker starts from them instead of importing
# the parser and boto3 again (seconds each on a busy machine).
_WORKER_PRELOAD = ["denpex.analysis.batch", "boto3", "botocore.client"]


def usable_cpus() -> int:
    """The CPUs this process may run on (a container's or taskset's share, not the host's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class QueuedBatch(NamedTuple):
    """A batch sent to the workers, kept with its refs (a dead worker is then retried per ref)."""

    future: Future[list[RankOutcome]]
    refs: list[DumpRef]
    max_bytes: int


class IsolatedWorkers:
    """``workers`` decode processes (default: the usable CPUs), started on first use.

    Each decode runs under ``cpu_budget`` in its worker. A worker that dies, or that the lanes
    kill for running past its batch's CPU allowance (a decode stuck in C), fails only its own
    batch; that batch is then run again one dump at a time on fresh workers, so the dump that
    kills its worker alone is reported as that rank's unusable evidence and every other rank keeps
    its summary.
    """

    def __init__(self, workers: int | None = None, *, cpu_budget: CpuBudget = DEFAULT_CPU_BUDGET) -> None:
        self._workers = workers or usable_cpus()
        self._budget = cpu_budget
        self._lanes: Lanes | None = None

    def summarize(self, refs: Sequence[DumpRef], max_bytes: int = DEFAULT_MAX_DUMP_BYTES) -> list[RankOutcome]:
        """``summarize_batch`` on a worker."""
        return self.collect(self.submit(refs, max_bytes))

    def submit(self, refs: Sequence[DumpRef], max_bytes: int = DEFAULT_MAX_DUMP_BYTES) -> QueuedBatch:
        """Queue a batch on the workers without waiting for it (``summarize_all`` queues them all)."""
        return QueuedBatch(self._send(list(refs), max_bytes), list(refs), max_bytes)

    def collect(self, queued: QueuedBatch) -> list[RankOutcome]:
        """The outcomes of a batch queued with ``submit``."""
        try:
            return queued.future.result()
        except LaneKilled as exc:
            if len(queued.refs) == 1:
                return [_worker_lost(queued.refs[0], exc)]
        except BrokenProcessPool:
            pass
        # One dump of the batch (or the kernel) took its worker: find which, on fresh workers.
        # A lone dump whose worker merely died gets this one more try too.
        alone = [(ref, self._send([ref], queued.max_bytes)) for ref in queued.refs]
        outcomes: list[RankOutcome] = []
        for ref, future in alone:
            try:
                outcomes.extend(future.result())
            except (BrokenProcessPool, LaneKilled) as exc:
                outcomes.append(_worker_lost(ref, exc))
        return outcomes

    def warm(self) -> None:
        """Start the workers now, without waiting: a flow calls this before it lists and waits for
        evidence, so the workers' start overlaps that wait instead of delaying the first batch."""
        self._current().warm()

    def worker_pids(self) -> set[int]:
        """The current workers' process ids (none before the first use)."""
        return self._lanes.worker_pids() if self._lanes is not None else set()

    def __enter__(self) -> IsolatedWorkers:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        lanes, self._lanes = self._lanes, None
        if lanes is not None:
            lanes.close()

    def _send(self, refs: list[DumpRef], max_bytes: int) -> Future[list[RankOutcome]]:
        # The lanes' own watch is the bound for a decode stuck in C, where the in-worker limit
        # cannot reach: the batch's budget, summed over its dumps.
        allowance = sum(self._budget.seconds_for(ref.size) for ref in refs)
        return self._current().submit(summarize_in_worker, refs, max_bytes, cpu_s=allowance)

    def _current(self) -> Lanes:
        if self._lanes is None:
            self._lanes = Lanes(self._workers, initializer=worker_init, initargs=(self._budget,),
                                preload=_WORKER_PRELOAD)
        return self._lanes


def _worker_lost(ref: DumpRef, exc: BaseException) -> SkippedFile:
    if isinstance(exc, LaneKilled):
        why = (f"decoding it ran past {exc.allowance_s:.1f} s of CPU without returning (hostile or "
               "pathological), so its parse worker was stopped")
    else:
        why = ("its parse worker died decoding it, on a fresh worker too (a dump that crashes the "
               "decoder, or a worker killed for memory); triage it alone with `denpex triage` to see why")
    return SkippedFile(path=ref.name, rank=ref.rank, reason=why)


def summarize_all(refs: Sequence[DumpRef], *, max_bytes: int = DEFAULT_MAX_DUMP_BYTES,
                  workers: int | None = None, store: EvidenceStore | None = None,
                  progress: Progress | None = None) -> list[RankOutcome]:
    """Summarize every dump, on worker processes once there are enough of them.

    The workers come from the forkserver, never a fork of this process: a fork copies the caller's
    whole heap into every worker (a test session or a long-lived service holding hundreds of MiB
    made one 64-rank triage take 30 s instead of 3). As with any forkserver or spawn pool, a
    script that calls this at import time needs an ``if __name__ == "__main__":`` guard (the
    workers import the caller's main module), and the forkserver process stays up for the next
    call. Outcomes come in batch order, not the refs' order; each carries its rank.
    """
    workers = workers if workers is not None else usable_cpus()
    if workers <= 1 or len(refs) < _POOL_THRESHOLD:
        outcomes = summarize_batch(refs, max_bytes, store)
        if progress is not None:
            progress(len(refs), len(refs))
        return outcomes
    batches = split_batches(refs, workers * 8)
    outcomes = []
    with IsolatedWorkers(workers) as pool:
        queued = [pool.submit(batch, max_bytes) for batch in batches]
        for batch in queued:
            outcomes.extend(pool.collect(batch))
            if progress is not None:
                progress(len(outcomes), len(refs))
    return outcomes
