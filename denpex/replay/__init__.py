"""Replays of stored incidents: every real incident becomes a regression test for the analyzer.

    catalog = load_catalog(Path("incidents/catalog.json"))
    report = replay_catalog(catalog)      # triage only, never remediation
    report.failed, drift_markdown(report)
"""

from __future__ import annotations

from denpex.replay.catalog import (
    CatalogError,
    IncidentCatalog,
    RecordedIncident,
    RecordedOutcome,
    load_catalog,
)
from denpex.replay.drift import DriftKind, ReplayOutcome, ReplayReport, drift_markdown, replay_catalog, replay_incident

__all__ = ["CatalogError", "DriftKind", "IncidentCatalog", "RecordedIncident", "RecordedOutcome",
           "ReplayOutcome", "ReplayReport", "drift_markdown", "load_catalog", "replay_catalog",
           "replay_incident"]
