"""The unit of parallel work: a batch of dump references in, compact summaries out.

A pure function of its arguments (it opens the store from the URI), so that a process pool, a
Prefect task or a benchmark can run it anywhere and ship back only the small results.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence

from denpex.analysis.rank_runs import RankRuns
from denpex.analysis.summary import RankSummary, summarize_dump
from denpex.evidence.cpu_budget import DEFAULT_CPU_BUDGET, CpuBudget, arm_cpu_limit
from denpex.evidence.dump_ref import DumpRef
from denpex.evidence.errors import DumpError
from denpex.evidence.fr_dump import decode_dump
from denpex.evidence.read_ahead import read_ahead
from denpex.evidence.skipped import SkippedFile
from denpex.evidence.store import EvidenceStore, store_for

__all__ = ["RankOutcome", "summarize_batch", "summarize_in_worker", "worker_init", "split_batches",
           "DEFAULT_MAX_DUMP_BYTES"]

DEFAULT_MAX_DUMP_BYTES = 256 * 1024 * 1024

RankOutcome = RankSummary | SkippedFile


def summarize_batch(refs: Sequence[DumpRef], max_bytes: int = DEFAULT_MAX_DUMP_BYTES,
                    store: EvidenceStore | None = None) -> list[RankOutcome]:
    """Read, decode and summarize each dump; a bad dump becomes a SkippedFile with its reason.

    A ref in ``store`` is read through it (its S3 client); any other is reopened from its URI."""
    outcomes: list[RankOutcome] = []
    stores: dict[str, EvidenceStore] = {store.uri: store} if store is not None else {}
    rank_lists: dict[str, RankRuns | None] = {}
    sources = [store_for(ref.store_uri, stores) for ref in refs]
    for ref, data in read_ahead(list(zip(refs, sources)), max_bytes):
        decoded = None
        try:
            if isinstance(data, DumpError):
                raise data
            decoded = decode_dump(data, source=ref.name)
            del data  # the raw bytes are not needed once decoded; keep peak memory down
            outcomes.append(summarize_dump(decoded, rank=ref.rank, rank_lists=rank_lists))
        except DumpError as exc:
            outcomes.append(SkippedFile(path=ref.name, rank=ref.rank, reason=str(exc)))
        finally:
            # Freed now, not when the next decode rebinds the name: that decode then reuses this
            # tree's memory instead of growing the heap beside it (about 2 ms a dump, measured).
            del decoded
    return outcomes


def split_batches(refs: Sequence[DumpRef], n_batches: int) -> list[list[DumpRef]]:
    """At most ``n_batches`` non-empty interleaved batches: ranks 0, n, 2n, ... share a batch, so
    workers stay evenly busy even when dump sizes vary by rank."""
    n = max(1, min(n_batches, len(refs)))
    return [list(refs[i::n]) for i in range(n)]


def summarize_in_worker(refs: Sequence[DumpRef], max_bytes: int = DEFAULT_MAX_DUMP_BYTES) -> list[RankOutcome]:
    """``summarize_batch`` on a dedicated worker process, which then frees what the batch left.

    Real dumps are acyclic, but a hostile one can hold a list that contains itself; with the cyclic
    collector off (``worker_init``) it would outlive its batch, and a long-lived worker would grow
    with every such dump. One collection per batch costs milliseconds.
    """
    try:
        return summarize_batch(refs, max_bytes)
    finally:
        gc.collect()


def worker_init(cpu_budget: CpuBudget = DEFAULT_CPU_BUDGET) -> None:
    """Runs once in each dedicated worker process, never in the caller's.

    Unpickled dumps are trees of plain containers with no reference cycles: reference counting
    frees each one the moment its summary is built. The cyclic collector would only re-walk the
    live dump again and again while it is being unpickled (about 40% of the load time).
    Each decode then runs under ``cpu_budget``: a pathological dump becomes that rank's
    ``SkippedFile`` instead of holding the worker (the limit is only ever armed in a worker).
    """
    gc.disable()
    arm_cpu_limit(cpu_budget)
