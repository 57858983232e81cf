"""The parse fan-out: one task per batch of dump references, decoded in worker processes.

Only compact summaries come back. Batches are interleaved so that dump sizes that grow with the
rank spread over all batches.
"""

from __future__ import annotations

from prefect import task

from denpex.analysis.batch import DEFAULT_MAX_DUMP_BYTES, RankOutcome, split_batches, summarize_batch_isolated
from denpex.evidence.discovery import DumpRef

__all__ = ["summarize_dumps", "split_batches"]


@task(name="summarize-dumps", retries=1, retry_delay_seconds=2)
def summarize_dumps(refs: list[DumpRef], max_bytes: int = DEFAULT_MAX_DUMP_BYTES) -> list[RankOutcome]:
    """Summarize one batch in a worker process (never in the flow's process)."""
    return summarize_batch_isolated(refs, max_bytes)
