"""Worker processes that decode untrusted dumps: the one process pool of the parse fan-out.

Two callers share it. ``summarize_all`` (the CLI and ``triage_path``) sends every batch of a large
incident at once. A flow run's parse tasks run batches on threads (a Prefect task runner) and send
each to ``IsolatedWorkers.summarize``, so batches use every core instead of queueing on the GIL.
Either way each decode gets the per-process memory budget. Workers come from a forkserver, so they never inherit the caller's threads or locks, and
they are started once: a process per batch paid the interpreter's start and the caller's
main-module import every time (most of a small incident's parse time).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
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
from denpex.evidence.discovery import DumpRef
from denpex.evidence.store import EvidenceStore

__all__ = ["IsolatedWorkers", "QueuedBatch", "WorkerDied", "Progress", "summarize_all", "usable_cpus"]

# Below this many dumps, starting worker processes costs more than it saves.
_POOL_THRESHOLD = 64

# Told (dumps done, dumps in all) as batches finish: a long triage can show its progress.
Progress = Callable[[int, int], None]

# Modules the forkserver imports once, so that each worker starts from them instead of importing
# the parser and boto3 again (seconds each on a busy machine).
_WORKER_PRELOAD = ["denpex.analysis.batch", "boto3", "botocore.client"]


class WorkerDied(RuntimeError):
    """A worker process died under a batch (a dump crashed the decoder, or the kernel killed it)."""


def usable_cpus() -> int:
    """The CPUs this process may run on (a container's or taskset's share, not the host's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _ready() -> None:
    """A no-op run on a worker, so that the worker is started."""


class QueuedBatch(NamedTuple):
    """A batch sent to a pool, kept with the pool it went to (a dead worker breaks only that one)."""

    pool: ProcessPoolExecutor
    future: Future[list[RankOutcome]]
    refs: list[DumpRef]


class IsolatedWorkers:
    """A pool of ``workers`` decode processes (default: the usable CPUs), started on first use."""

    def __init__(self, workers: int | None = None) -> None:
        self._workers = workers or usable_cpus()
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def summarize(self, refs: Sequence[DumpRef], max_bytes: int = DEFAULT_MAX_DUMP_BYTES) -> list[RankOutcome]:
        """``summarize_batch`` on a worker.

        A worker that dies breaks the whole pool (every batch in flight fails with it): this
        raises ``WorkerDied`` naming the batch's dumps, and the next call starts fresh workers.
        """
        return self.collect(self.submit(refs, max_bytes))

    def submit(self, refs: Sequence[DumpRef], max_bytes: int = DEFAULT_MAX_DUMP_BYTES) -> QueuedBatch:
        """Queue a batch on the workers without waiting for it (``summarize_all`` queues them all)."""
        pool = self._current()
        return QueuedBatch(pool, pool.submit(summarize_in_worker, list(refs), max_bytes), list(refs))

    def collect(self, queued: QueuedBatch) -> list[RankOutcome]:
        """The outcomes of a batch queued with ``submit``; ``WorkerDied`` if its worker died."""
        try:
            return queued.future.result()
        except BrokenProcessPool as exc:
            self._discard(queued.pool)
            refs = queued.refs
            names = ", ".join(ref.name for ref in refs[:5]) + (f" and {len(refs) - 5} more" if len(refs) > 5 else "")
            raise WorkerDied(
                f"a parse worker died while this batch was in flight ({names}); a dump that crashes "
                "the decoder or a worker killed for memory does this. Fresh workers take the next batch "
                "(a flow's parse task retries this one); if it fails again, triage these files one by "
                "one with `denpex triage`"
            ) from exc

    def warm(self) -> None:
        """Start the workers now, without waiting: a flow calls this before it lists and waits for
        evidence, so the workers' start overlaps that wait instead of delaying the first batch."""
        pool = self._current()
        for _ in range(self._workers):
            pool.submit(_ready)

    def __enter__(self) -> IsolatedWorkers:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _current(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                context = multiprocessing.get_context("forkserver")
                context.set_forkserver_preload(_WORKER_PRELOAD)
                self._pool = ProcessPoolExecutor(max_workers=self._workers, mp_context=context,
                                                 initializer=worker_init)
            return self._pool

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)


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
