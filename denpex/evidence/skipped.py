"""A file that was not used as evidence, and why (``skipped_files`` of the triage's JSON).

Discovery sets files aside before any analysis runs, and the parse sets aside dumps it cannot
read, so the record belongs to the evidence layer; ``denpex.analysis.models.TriageResult`` lists them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["SkippedFile"]


class SkippedFile(BaseModel):
    """A file that was not used as evidence, and why."""

    model_config = ConfigDict(frozen=True)

    path: str
    reason: str
    rank: int | None = None
    # Set when the file is the same dump as another one that is used (pickle and JSON of a rank).
    copy_of: str | None = None
