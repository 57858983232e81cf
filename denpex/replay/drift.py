"""Replay stored incidents through triage and say where today's analyzer disagrees.

Triage only: nothing here plans or executes an isolation. Worked example::

    recorded: localized, {2: not_entered}   replayed: ambiguous, {2: not_entered, 3: stalled}
    -> ReplayOutcome(drift=verdict_changed, detail="verdict localized -> ambiguous; ...")
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from denpex.analysis.models import CandidateKind, Verdict
from denpex.evidence.errors import EvidenceError
from denpex.hardware import HardwareError
from denpex.investigate import investigate
from denpex.markdown_text import inline
from denpex.replay.catalog import IncidentCatalog, RecordedIncident

__all__ = ["DriftKind", "ReplayOutcome", "ReplayReport", "replay_incident", "replay_catalog",
           "drift_markdown"]


class DriftKind(StrEnum):
    """How a replay compares with the recorded outcome."""

    UNCHANGED = "unchanged"
    """Same verdict, same culprits with the same kinds."""
    VERDICT_CHANGED = "verdict_changed"
    """The verdict differs from the recorded one."""
    CULPRITS_CHANGED = "culprits_changed"
    """Same verdict, but other culprits or other kinds."""
    UNREADABLE = "unreadable"
    """The stored evidence could not be triaged at all (moved, deleted, or now refused)."""

    @property
    def fails(self) -> bool:
        """Every drift fails the replay run: a changed answer on a known incident is a regression
        until someone re-records it."""
        return self is not DriftKind.UNCHANGED


class ReplayOutcome(BaseModel):
    """One incident's replay."""

    model_config = ConfigDict(frozen=True)

    incident_id: str
    evidence: str
    drift: DriftKind
    recorded_verdict: Verdict
    replayed_verdict: Verdict | None = None
    recorded_culprits: dict[int, CandidateKind]
    replayed_culprits: dict[int, CandidateKind] | None = None
    detail: str = ""


class ReplayReport(BaseModel):
    """Every incident's replay, in catalog order."""

    model_config = ConfigDict(frozen=True)

    outcomes: list[ReplayOutcome]

    @property
    def failed(self) -> list[ReplayOutcome]:
        return [o for o in self.outcomes if o.drift.fails]


def replay_incident(incident: RecordedIncident, catalog: IncidentCatalog) -> ReplayOutcome:
    """Triage the stored evidence again and compare with what was recorded."""
    location = incident.evidence_location(catalog.base_dir)
    recorded = incident.recorded
    base = ReplayOutcome(incident_id=incident.incident_id, evidence=location, drift=DriftKind.UNREADABLE,
                         recorded_verdict=recorded.verdict, recorded_culprits=recorded.culprits)
    try:
        found = investigate(location, world_size=incident.world_size, as_of=incident.as_of)
    except (EvidenceError, HardwareError, ValueError) as exc:
        return base.model_copy(update={"detail": str(exc)})
    report = found.report
    culprits = {c.rank: c.kind for c in report.candidates}
    problems = []
    if report.verdict is not recorded.verdict:
        problems.append(f"verdict {recorded.verdict.value} -> {report.verdict.value}")
    if culprits != recorded.culprits:
        problems.append(f"culprits {_culprits(recorded.culprits)} -> {_culprits(culprits)}")
    drift = (DriftKind.VERDICT_CHANGED if report.verdict is not recorded.verdict
             else DriftKind.CULPRITS_CHANGED if problems else DriftKind.UNCHANGED)
    return base.model_copy(update={"drift": drift, "replayed_verdict": report.verdict,
                                   "replayed_culprits": culprits, "detail": "; ".join(problems)})


def replay_catalog(catalog: IncidentCatalog) -> ReplayReport:
    """Replay every incident of the catalog, one after the other."""
    return ReplayReport(outcomes=[replay_incident(i, catalog) for i in catalog.incidents])


def drift_markdown(report: ReplayReport) -> str:
    """A markdown summary and table, drifted incidents first."""
    failed = report.failed
    head = (f"**{len(failed)} of {len(report.outcomes)} incidents drifted**" if failed
            else f"All {len(report.outcomes)} incidents replay as recorded.")
    rows = ["| incident | drift | recorded | replayed | detail |", "|---|---|---|---|---|"]
    for o in sorted(report.outcomes, key=lambda o: not o.drift.fails):
        replayed = (f"{o.replayed_verdict.value} {_culprits(o.replayed_culprits or {})}"
                    if o.replayed_verdict else "-")
        rows.append(f"| {_cell(o.incident_id)} | {o.drift.value} | "
                    f"{o.recorded_verdict.value} {_culprits(o.recorded_culprits)} | {replayed} | "
                    f"{_cell(o.detail)} |")
    return "\n".join(["# Incident replay", "", head, "", *rows]) + "\n"


def _culprits(culprits: dict[int, CandidateKind]) -> str:
    """``{2: not_entered}`` -> ``[2 not_entered]``."""
    return "[" + ", ".join(f"{r} {k.value}" for r, k in sorted(culprits.items())) + "]"


def _cell(text: str) -> str:
    """A table cell: one line, its pipes and any markup literal (details quote evidence)."""
    return inline(text, limit=300)
