"""The replay flow on the real Prefect engine: it passes on the bundled catalog, fails on a
deliberately changed verdict, and lists drains older than the review age from the audit log."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

import pytest

from prefect.client.orchestration import get_client

from denpex.isolation.audit import AuditEntry, AuditKind, AuditLog, Outcome
from denpex.isolation.plan import Operation
from flows.replay import ReplayDrift, replay

# Sized to what it starts: the harness server.
pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "incidents" / "catalog.json"


@pytest.fixture(autouse=True)
def harness(prefect_harness: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The session's test-harness server (tests/plugins/services.py), and the test's folder as the
    state directory (the replay reads catalogs and audit logs only there, or the bundled catalog)."""
    monkeypatch.setenv("DENPEX_STATE_DIR", str(tmp_path))
    return prefect_harness


def small_catalog(tmp_path: Path, change_verdict: bool) -> Path:
    """Three real incidents (absolute paths); optionally record a wrong verdict for one."""
    raw = json.loads(CATALOG.read_text())
    keep = {"gloo-withheld-one", "gloo-sigkill", "gloo-healthy"}
    incidents = [i for i in raw["incidents"] if i["incident_id"] in keep]
    for entry in incidents:
        entry["evidence"] = str((CATALOG.parent / entry["evidence"]).resolve())
        if change_verdict and entry["incident_id"] == "gloo-withheld-one":
            entry["recorded"]["verdict"] = "ambiguous"
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"version": 1, "incidents": incidents}))
    return path


async def artifact_markdown(key: str, flow_run_id: UUID | None) -> str:
    """The artifact ``key`` of this flow run (another run may have one with the same key)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    async with get_client() as client:
        found = await client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id] if flow_run_id else [])))
    return str(found[0].data) if found else ""


def test_replay_passes_when_every_incident_replays_as_recorded(tmp_path: Path) -> None:
    report = replay(catalog=str(small_catalog(tmp_path, change_verdict=False)))
    assert len(report.outcomes) == 3 and report.failed == []


@pytest.mark.anyio
async def test_a_changed_verdict_fails_the_run_with_a_drift_artifact(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    AuditLog(audit).append(AuditEntry(
        kind=AuditKind.RESULT, incident_id="inc-old", plan_hash="a" * 64, operation=Operation.ISOLATE,
        node="gpu-node-002", action="drain", approver="alice", outcome=Outcome.APPLIED),
        at=datetime.now(UTC) - timedelta(days=30))
    state = replay(catalog=str(small_catalog(tmp_path, change_verdict=True)), audit_log=str(audit),
                   review_age_hours=24 * 7, return_state=True)
    assert state.is_failed()
    with pytest.raises(ReplayDrift, match="gloo-withheld-one .*verdict ambiguous -> localized"):
        await state.aresult()
    run_id = state.state_details.flow_run_id
    drift = await artifact_markdown("replay-drift", run_id)
    assert "1 of 3 incidents drifted" in drift and "verdict_changed" in drift
    overdue = await artifact_markdown("isolations-due-for-review", run_id)
    assert "gpu-node-002" in overdue and "inc-old" in overdue


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_the_catalog_and_audit_log_are_the_bundled_catalog_or_files_under_the_state_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30 section 3: the replay's ``catalog`` and ``audit_log`` come through the Prefect API,
    and named any file the worker could read (another operator's audit log, a catalog pointing
    anywhere). Outside the bundled catalog and the state directory, the run reads nothing."""
    from denpex.workflow.flow_parameters import FlowParameterError

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    audit = elsewhere / "audit.jsonl"
    AuditLog(audit).append(AuditEntry(
        kind=AuditKind.RESULT, incident_id="inc-theirs", plan_hash="a" * 64, operation=Operation.ISOLATE,
        node="gpu-node-002", action="drain", approver="alice", outcome=Outcome.APPLIED),
        at=datetime.now(UTC) - timedelta(days=30))
    catalog = small_catalog(elsewhere, change_verdict=False)
    monkeypatch.setenv("DENPEX_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "escape").symlink_to(elsewhere)  # a link out of the state directory is followed
    for kwargs, why in (
            ({"catalog": str(catalog)}, "is neither the bundled catalog"),
            ({"catalog": str(tmp_path / "state" / "escape" / "catalog.json")}, "is neither the bundled catalog"),
            ({"catalog": "/etc/passwd"}, "is neither the bundled catalog"),
            ({"catalog": "incidents/../../../etc/passwd"}, "is neither the bundled catalog"),
            ({"catalog": str(CATALOG), "audit_log": str(audit)}, "audit_log .* is not a file under the state directory"),
    ):
        with pytest.raises(FlowParameterError, match=why):
            replay(**kwargs)
    # The bundled catalog by its relative name (prefect.yaml's), and files under the state directory.
    inside = tmp_path / "state" / "catalog.json"
    inside.write_text(catalog.read_text())
    assert replay(catalog=str(inside)).failed == []
