"""The incident catalog: past incidents with the verdict that was recorded for each.

One JSON file; evidence paths are folders relative to the catalog file, absolute folders, or
``s3://`` URIs. Unknown keys are refused, so a typo fails loudly::

    {"version": 1,
     "incidents": [
       {"incident_id": "gloo-withheld-one",
        "evidence": "../tests/fixtures/gloo/withheld_one",
        "description": "rank 2 never calls its tp all_reduce",
        "recorded": {"verdict": "localized", "culprits": {"2": "not_entered"},
                     "recorded_at": "2026-11-29T18:45:02Z"}}]}
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from denpex.analysis.models import CandidateKind, Verdict
from denpex.evidence.loading import FileKind, read_model

__all__ = ["CatalogError", "RecordedOutcome", "RecordedIncident", "IncidentCatalog", "load_catalog",
           "CATALOG_VERSION"]

CATALOG_VERSION = 1
_MAX_BYTES = 16 * 1024 * 1024
_CATALOG_FILE = FileKind("the incident catalog", invalid="invalid incident catalog", unparsable="not JSON",
                         shape="expected an object with 'version' and 'incidents'")


class CatalogError(ValueError):
    """The catalog file cannot be read or does not validate; the message lists every problem."""


class RecordedOutcome(BaseModel):
    """What triage said (and people confirmed) when the incident happened."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    verdict: Verdict
    culprits: dict[int, CandidateKind] = Field(default_factory=dict)
    recorded_at: datetime | None = None


class RecordedIncident(BaseModel):
    """One stored incident: where its evidence lies and its recorded outcome."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    incident_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,126}$")
    evidence: str = Field(min_length=1)
    description: str = ""
    world_size: int | None = Field(default=None, ge=1)
    # The incident's time; None judges staleness against the newest time in the evidence.
    as_of: datetime | None = None
    recorded: RecordedOutcome

    def evidence_location(self, catalog_dir: Path) -> str:
        """The folder or URI to triage: relative folders are read from the catalog's folder."""
        if "://" in self.evidence or Path(self.evidence).is_absolute():
            return self.evidence
        return str((catalog_dir / self.evidence).resolve())


class IncidentCatalog(BaseModel):
    """The whole catalog file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = Field(ge=1, le=CATALOG_VERSION)
    incidents: list[RecordedIncident]
    # Where the file was read from; relative evidence paths start here.
    base_dir: Path = Path(".")


def load_catalog(path: Path) -> IncidentCatalog:
    """Read and validate ``path``; duplicated incident ids are refused too."""
    def with_base_dir(raw: dict[str, Any]) -> dict[str, Any]:
        if "base_dir" in raw:  # the catalog's folder is where the file is, never what it says
            raise CatalogError(f"{path}: expected an object with 'version' and 'incidents'")
        return {**raw, "base_dir": path.resolve().parent}

    catalog = read_model(path, IncidentCatalog, max_bytes=_MAX_BYTES, kind=_CATALOG_FILE, error=CatalogError,
                         prepare=with_base_dir)
    counts = Counter(i.incident_id for i in catalog.incidents)
    duplicated = sorted(name for name, n in counts.items() if n > 1)
    if duplicated:
        raise CatalogError(f"{path}: incident ids appear more than once: {', '.join(duplicated)}")
    return catalog
