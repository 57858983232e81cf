"""The parse fan-out on a Dask cluster (prefect-dask), for jobs whose dumps outgrow one machine.

The incident flow calls ``parse_on_dask`` with the cluster's address (a setting, e.g.
``DENPEX_DASK_ADDRESS``); without one, a local cluster of worker processes is started for the run.
Each task decodes one batch of untrusted dumps inside a Dask worker process (never in the flow's
process) and ships back only the compact summaries.
"""

from __future__ import annotations

import os
from typing import Any, cast

from prefect import flow, task, unmapped
from prefect.futures import PrefectFuture
from prefect.task_runners import TaskRunner
from prefect_dask import DaskTaskRunner

from denpex.analysis.batch import DEFAULT_MAX_DUMP_BYTES, RankOutcome, summarize_batch
from denpex.evidence.dump_ref import DumpRef
from flows import DASK_ADDRESS_ENV
from tasks.options import NOT_CACHED
from tasks.options import NOT_PERSISTED

__all__ = ["DASK_ADDRESS_ENV", "dask_task_runner", "parse_on_dask", "summarize_batch_on_worker"]



@task(name="summarize-batch-on-dask", retries=1, retry_delay_seconds=2, **NOT_CACHED)
def summarize_batch_on_worker(refs: list[DumpRef], max_bytes: int = DEFAULT_MAX_DUMP_BYTES) -> list[RankOutcome]:
    """One batch, read from the store and decoded in the Dask worker process running this task."""
    return summarize_batch(refs, max_bytes)


def dask_task_runner(address: str | None = None, local_workers: int = 2) -> DaskTaskRunner:
    """A runner on the cluster at ``address`` (or ``$DENPEX_DASK_ADDRESS``), else on a local cluster
    of ``local_workers`` single-threaded worker processes started for the run."""
    address = address or os.environ.get(DASK_ADDRESS_ENV) or None
    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": local_workers, "threads_per_worker": 1,
                                          "processes": True})


@flow(name="denpex-parse-on-dask", **NOT_PERSISTED)
def _parse_batches(batches: list[list[DumpRef]], max_bytes: int = DEFAULT_MAX_DUMP_BYTES) -> list[RankOutcome]:
    futures = summarize_batch_on_worker.map(batches, unmapped(max_bytes))
    return [outcome for future in futures for outcome in future.result()]


def parse_on_dask(batches: list[list[DumpRef]], *, address: str | None = None,
                  max_bytes: int = DEFAULT_MAX_DUMP_BYTES, local_workers: int = 2) -> list[RankOutcome]:
    """Run the fan-out as a subflow whose task runner is the Dask cluster (chosen at run time)."""
    # DaskTaskRunner is a TaskRunner of Dask futures; with_options is typed for the base future.
    runner = cast("TaskRunner[PrefectFuture[Any]]", dask_task_runner(address, local_workers))
    return _parse_batches.with_options(task_runner=runner)(batches, max_bytes)
