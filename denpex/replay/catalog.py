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

import json
from collections import Counter
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from denpex.analysis.models import CandidateKind, Verdict

__all__ = ["CatalogError", "RecordedOutcome", "RecordedIncident", "IncidentCatalog", "load_catalog",
           "CATALOG_VERSION"]

CATALOG_VERSION = 1
_MAX_BYTES = 16 * 1024 * 1024


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
    try:
        if path.stat().st_size > _MAX_BYTES:
            raise CatalogError(f"{path}: the catalog is over {_MAX_BYTES} bytes")
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read the incident catalog: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise CatalogError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}); fix the file") from exc
    if not isinstance(raw, dict) or "base_dir" in raw:
        raise CatalogError(f"{path}: expected an object with 'version' and 'incidents'")
    try:
        catalog = IncidentCatalog.model_validate({**raw, "base_dir": path.resolve().parent})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise CatalogError(f"{path}: invalid incident catalog: {problems}") from exc
    counts = Counter(i.incident_id for i in catalog.incidents)
    duplicated = sorted(name for name, n in counts.items() if n > 1)
    if duplicated:
        raise CatalogError(f"{path}: incident ids appear more than once: {', '.join(duplicated)}")
    return catalog
