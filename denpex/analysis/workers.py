"""Worker processes that decode untrusted dumps for a flow run's parse fan-out.

For callers that run batches on threads (a Prefect task runner): each batch goes to a worker, so
batches use every core instead of queueing on the GIL, and each decode gets the per-process memory
budget. Workers come from a forkserver, so they never inherit the caller's threads or locks, and
they are started once: a process per batch paid the interpreter's start and the caller's
main-module import every time (most of a small incident's parse time).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from denpex.analysis.batch import DEFAULT_MAX_DUMP_BYTES, RankOutcome, summarize_in_worker, worker_init
from denpex.evidence.discovery import DumpRef

__all__ = ["IsolatedWorkers", "WorkerDied", "usable_cpus"]

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
        pool = self._current()
        try:
            return pool.submit(summarize_in_worker, list(refs), max_bytes).result()
        except BrokenProcessPool as exc:
            self._discard(pool)
            names = ", ".join(ref.name for ref in refs[:5]) + (f" and {len(refs) - 5} more" if len(refs) > 5 else "")
            raise WorkerDied(
                f"a parse worker died while this batch was in flight ({names}); a dump that crashes "
                "the decoder or a worker killed for memory does this. The batch is retried on fresh "
                "workers; if it fails again, triage these files one by one with `denpex triage`"
            ) from exc

    def warm(self) -> None:
        """Start the workers now, without waiting: a flow calls this before it lists and waits for
        evidence, so the workers' start overlaps that wait instead of delaying the first batch."""
        pool = self._current()
        for _ in range(self._workers):
            pool.submit(_ready)

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
