"""The parse fan-out: one task per batch of dump references, decoded in worker processes.

Only compact summaries come back. Batches are interleaved so that dump sizes that grow with the
rank spread over all batches. The workers are started once per parse (warmed while the flow waits
for evidence) and stopped when it is done.
"""

from __future__ import annotations

import atexit

from prefect import task

from denpex.analysis.batch import DEFAULT_MAX_DUMP_BYTES, RankOutcome, split_batches
from denpex.analysis.workers import IsolatedWorkers
from denpex.evidence.dump_ref import DumpRef
from tasks.options import NOT_CACHED

__all__ = ["summarize_dumps", "split_batches", "warm_parse_workers", "release_parse_workers"]

_WORKERS = IsolatedWorkers()
atexit.register(_WORKERS.close)


@task(name="summarize-dumps", retries=1, retry_delay_seconds=2, **NOT_CACHED)
def summarize_dumps(refs: list[DumpRef], max_bytes: int = DEFAULT_MAX_DUMP_BYTES) -> list[RankOutcome]:
    """Summarize one batch in a worker process (never in the flow's process)."""
    return _WORKERS.summarize(refs, max_bytes)


def warm_parse_workers() -> None:
    """Start the parse workers in the background (they import for seconds on a busy machine)."""
    _WORKERS.warm()


def release_parse_workers() -> None:
    """Stop the parse workers once a parse is done: the run may then wait hours for approval, and
    idle workers would hold memory, and outlive the run if it is killed meanwhile. The re-read
    before remediation starts fresh ones."""
    _WORKERS.close()
