"""The replay core: the bundled catalog replays as recorded; a changed record is caught."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from denpex.isolation.audit import AuditEntry, AuditKind, AuditLog, Outcome
from denpex.isolation.drain_review import overdue_isolations, overdue_markdown, standing_isolations
from denpex.isolation.plan import Operation
from denpex.replay import CatalogError, DriftKind, drift_markdown, load_catalog, replay_catalog

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "incidents" / "catalog.json"


def test_bundled_catalog_holds_every_real_gloo_incident_and_replays_unchanged() -> None:
    catalog = load_catalog(CATALOG)
    folders = sorted(p.name for p in (ROOT / "tests" / "fixtures" / "gloo").iterdir() if p.is_dir())
    assert sorted(Path(i.evidence).name for i in catalog.incidents) == folders
    report = replay_catalog(catalog)
    assert [o.drift for o in report.outcomes] == [DriftKind.UNCHANGED] * len(folders), drift_markdown(report)
    assert report.failed == []


def changed_catalog(tmp_path: Path, incident: str, verdict: str, culprits: dict[str, str]) -> Path:
    raw = json.loads(CATALOG.read_text())
    for entry in raw["incidents"]:
        entry["evidence"] = str((CATALOG.parent / entry["evidence"]).resolve())
        if entry["incident_id"] == incident:
            entry["recorded"] = {"verdict": verdict, "culprits": culprits}
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(("verdict", "culprits", "drift"), [
    pytest.param("ambiguous", {"2": "not_entered"}, DriftKind.VERDICT_CHANGED, id="verdict"),
    pytest.param("localized", {"3": "not_entered"}, DriftKind.CULPRITS_CHANGED, id="culprits"),
])
def test_a_changed_record_is_reported_as_drift(tmp_path: Path, verdict: str, culprits: dict[str, str],
                                               drift: DriftKind) -> None:
    catalog = load_catalog(changed_catalog(tmp_path, "gloo-withheld-one", verdict, culprits))
    report = replay_catalog(catalog)
    [failed] = report.failed
    assert failed.incident_id == "gloo-withheld-one" and failed.drift is drift
    markdown = drift_markdown(report)
    assert "1 of 9 incidents drifted" in markdown
    assert markdown.index("gloo-withheld-one") < markdown.index("gloo-healthy")


def test_missing_evidence_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"version": 1, "incidents": [{
        "incident_id": "gone", "evidence": "no/such/folder",
        "recorded": {"verdict": "localized", "culprits": {"2": "not_entered"}}}]}))
    [outcome] = replay_catalog(load_catalog(path)).outcomes
    assert outcome.drift is DriftKind.UNREADABLE and "no/such/folder" in outcome.detail


@pytest.mark.parametrize(("body", "message"), [
    pytest.param("{not json", "not JSON", id="not-json"),
    pytest.param('{"version": 1, "incidents": [], "extra": 1}', "extra", id="unknown-key"),
    pytest.param('{"version": 1, "incidents": [{"incident_id": "a", "evidence": "x", '
                 '"recorded": {"verdict": "maybe"}}]}', "verdict", id="bad-verdict"),
    pytest.param('{"version": 1, "incidents": [' + ",".join(
        ['{"incident_id": "a", "evidence": "x", "recorded": {"verdict": "no_hang"}}'] * 2) + "]}",
        "more than once", id="duplicate"),
])
def test_bad_catalogs_are_refused_clearly(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "catalog.json"
    path.write_text(body)
    with pytest.raises(CatalogError, match=message):
        load_catalog(path)


def write_drains(path: Path, now: datetime) -> None:
    log = AuditLog(path)
    def result(node: str, operation: Operation, days_ago: float) -> None:
        log.append(AuditEntry(kind=AuditKind.RESULT, incident_id="inc-1", plan_hash="h" * 64,
                              operation=operation, node=node, action="drain", approver="alice",
                              outcome=Outcome.APPLIED), at=now - timedelta(days=days_ago))
    result("gpu-node-002", Operation.ISOLATE, 19)
    result("gpu-node-003", Operation.ISOLATE, 18)
    result("gpu-node-003", Operation.ROLLBACK, 17)
    result("gpu-node-004", Operation.ISOLATE, 1)


def test_drains_older_than_the_review_age_are_listed(tmp_path: Path) -> None:
    now = datetime(2026, 11, 20, tzinfo=UTC)
    write_drains(tmp_path / "audit.jsonl", now)
    records = AuditLog(tmp_path / "audit.jsonl").records()
    assert [s.node for s in standing_isolations(records)] == ["gpu-node-002", "gpu-node-004"]
    overdue = overdue_isolations(records, now=now, review_age=timedelta(days=7))
    assert [(s.node, s.age(now)) for s in overdue] == [("gpu-node-002", timedelta(days=19))]
    assert "gpu-node-002" in overdue_markdown(overdue, now=now, review_age=timedelta(days=7))
