"""The unit of parallel work: a batch of dump references in, compact summaries out.

A pure function of its arguments (it opens the store from the URI), so that a process pool, a
Prefect task or a benchmark can run it anywhere and ship back only the small results.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from denpex.analysis.models import SkippedFile
from denpex.analysis.rank_runs import RankRuns
from denpex.analysis.summary import RankSummary, summarize_dump
from denpex.evidence.discovery import DumpRef
from denpex.evidence.errors import DumpError
from denpex.evidence.fr_dump import decode_dump
from denpex.evidence.store import EvidenceStore, open_store

__all__ = ["RankOutcome", "Progress", "summarize_batch", "IsolatedWorkers", "split_batches",
           "summarize_all", "DEFAULT_MAX_DUMP_BYTES"]

DEFAULT_MAX_DUMP_BYTES = 256 * 1024 * 1024
# Below this many dumps, starting worker processes costs more than it saves.
_POOL_THRESHOLD = 64

RankOutcome = RankSummary | SkippedFile


def summarize_batch(refs: Sequence[DumpRef], max_bytes: int = DEFAULT_MAX_DUMP_BYTES,
                    store: EvidenceStore | None = None) -> list[RankOutcome]:
    """Read, decode and summarize each dump; a bad dump becomes a SkippedFile with its reason."""
    outcomes: list[RankOutcome] = []
    stores: dict[str, EvidenceStore] = {}
    rank_lists: dict[str, RankRuns | None] = {}
    sources = [store if store is not None else _store_for(ref.store_uri, stores) for ref in refs]
    for ref, data in _read_ahead(list(zip(refs, sources)), max_bytes):
        try:
            if isinstance(data, DumpError):
                raise data
            decoded = decode_dump(data, source=ref.name)
            del data  # the raw bytes are not needed once decoded; keep peak memory down
            outcomes.append(summarize_dump(decoded, rank=ref.rank, rank_lists=rank_lists))
        except DumpError as exc:
            outcomes.append(SkippedFile(path=ref.name, rank=ref.rank, reason=str(exc)))
    return outcomes


_Fetched = bytes | DumpError | MemoryError


def _read_ahead(work: list[tuple[DumpRef, EvidenceStore]],
                max_bytes: int) -> Iterator[tuple[DumpRef, bytes | DumpError]]:
    """Each dump's bytes, the next one fetched on a thread while this one is decoded.

    Over S3 each read waits on the network and on the store's server; decoding holds the GIL but a
    socket read does not, so one read in flight hides most of that wait. Only one dump ahead is
    held, so peak memory grows by one raw dump, not by a batch.
    """
    if not work:
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="denpex-read") as reader:
        pending: Future[_Fetched] = reader.submit(_read, *work[0], max_bytes)
        for index, (ref, source) in enumerate(work):
            data = pending.result()
            if index + 1 < len(work):
                pending = reader.submit(_read, *work[index + 1], max_bytes)
            if isinstance(data, MemoryError):
                # The read overlapped a decode's memory cap (memory_budget); read again outside it.
                data = _read(ref, source, max_bytes)
            yield ref, DumpError("out of memory while reading") if isinstance(data, MemoryError) else data


def _read(ref: DumpRef, source: EvidenceStore, max_bytes: int) -> _Fetched:
    try:
        return source.read(ref.name, max_bytes=max_bytes)
    except (DumpError, MemoryError) as exc:
        return exc


def _store_for(uri: str, stores: dict[str, EvidenceStore]) -> EvidenceStore:
    # One store (one S3 client and its connection pool) per batch: a client per dump cost about
    # 0.1 s each, ten times the GET itself.
    if uri not in stores:
        stores[uri] = open_store(uri)
    return stores[uri]


def split_batches(refs: Sequence[DumpRef], n_batches: int) -> list[list[DumpRef]]:
    """At most ``n_batches`` non-empty interleaved batches: ranks 0, n, 2n, ... share a batch, so
    workers stay evenly busy even when dump sizes vary by rank."""
    n = max(1, min(n_batches, len(refs)))
    return [list(refs[i::n]) for i in range(n)]


def _worker_init() -> None:
    """Runs once in each dedicated worker process, never in the caller's.

    Unpickled dumps are trees of plain containers with no reference cycles: reference counting
    frees each one the moment its summary is built. The cyclic collector would only re-walk the
    live dump again and again while it is being unpickled (about 40% of the load time).
    """
    gc.disable()


# Told (dumps done, dumps in all) as batches finish: a long triage can show its progress.
Progress = Callable[[int, int], None]


def summarize_all(refs: Sequence[DumpRef], *, max_bytes: int = DEFAULT_MAX_DUMP_BYTES,
                  workers: int | None = None, store: EvidenceStore | None = None,
                  progress: Progress | None = None) -> list[RankOutcome]:
    """Summarize every dump, in a process pool once there are enough of them."""
    workers = workers if workers is not None else (os.cpu_count() or 1)
    if workers <= 1 or len(refs) < _POOL_THRESHOLD:
        outcomes = summarize_batch(refs, max_bytes, store)
        if progress is not None:
            progress(len(refs), len(refs))
        return outcomes
    batches = split_batches(refs, workers * 8)
    outcomes = []
    with ProcessPoolExecutor(max_workers=workers, initializer=_worker_init) as pool:
        for result in pool.map(summarize_batch, batches, [max_bytes] * len(batches)):
            outcomes.extend(result)
            if progress is not None:
                progress(len(outcomes), len(refs))
    return outcomes


# Modules the forkserver imports once, so that each worker starts from them instead of importing
# the parser and boto3 again (seconds each on a busy machine).
_WORKER_PRELOAD = ["denpex.analysis.batch", "boto3", "botocore.client"]


def _ready() -> None:
    """A no-op run on a worker, so that the worker is started."""


class IsolatedWorkers:
    """Worker processes that decode untrusted dumps away from the caller's process, kept for as
    long as the caller runs (a flow run), one per core.

    For callers that run batches on threads (a Prefect task runner): each batch goes to a worker,
    so batches use every core instead of queueing on the GIL, and each decode gets the per-process
    memory budget. Workers come from a forkserver, so they never inherit the caller's threads or
    locks, and they are started once: a process per batch paid the interpreter's start and the
    caller's main-module import every time (most of a small incident's parse time).
    """

    def __init__(self, workers: int | None = None) -> None:
        self._workers = workers or (os.cpu_count() or 1)
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def summarize(self, refs: Sequence[DumpRef], max_bytes: int = DEFAULT_MAX_DUMP_BYTES) -> list[RankOutcome]:
        """``summarize_batch`` on a worker. A worker that died (a dump that crashed the decoder)
        breaks only this pool: the error is raised and the next call starts fresh workers."""
        pool = self._current()
        try:
            return pool.submit(summarize_batch, list(refs), max_bytes).result()
        except BrokenProcessPool:
            self._discard(pool)
            raise

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
                                                 initializer=_worker_init)
            return self._pool

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)
