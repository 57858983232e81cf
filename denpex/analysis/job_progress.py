"""Every rank's sequence counters per process group: what the pictures of a triage need.

A few ints per rank whatever the ring size, so it can travel beside the result (CLI, flow
artifacts) where the summaries themselves should not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field

from denpex.analysis.summary import RankSummary
from denpex.evidence.skipped import SkippedFile

__all__ = ["GroupPosition", "JobProgress", "job_progress"]


class GroupPosition(BaseModel):
    """One rank's counters in one process group."""

    model_config = ConfigDict(frozen=True)

    last_enqueued: int
    last_completed: int


class JobProgress(BaseModel):
    """Every rank's counters per process group: a few ints per rank, whatever the ring size."""

    world_size: int
    positions: dict[int, dict[str, GroupPosition]] = Field(default_factory=dict)


def job_progress(summaries: Mapping[int, RankSummary] | Iterable[RankSummary | SkippedFile],
                 world_size: int) -> JobProgress:
    """Keep only the sequence counters of each rank's groups.

    Takes the summaries by rank, or the fan-out's outcomes as they come (skipped files ignored).
    """
    items = summaries.values() if isinstance(summaries, Mapping) else summaries
    return JobProgress(world_size=world_size, positions={
        summary.rank: {name: GroupPosition(last_enqueued=g.last_enqueued, last_completed=g.last_completed)
                       for name, g in summary.groups.items()}
        for summary in items if isinstance(summary, RankSummary)
    })
