"""A cut audit log is caught on the flow path, across incidents, on the real Prefect engine and Slurm.

Every writer (a decision, an execution) extends the cluster's stored copy in the operator's audit
store (here the default, ``<state_dir>/audit-store``); every action first checks that the log
extends it. A log cut back to before a record, which still chains, stops the next incident's
drain and an incident's return to service, with the reason, and touches nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from conftest import FIXTURES, register_blocks, upload
from denpex.isolation.audit import AuditKind, AuditLog, AuditRecord
from denpex.isolation.operator import state_audit_log
from flow_driver import (
    CULPRIT_NODE,
    FlowRig,
    alert,
    evidence_prefix,
    keyed_audit_log,
    manifest_with_gpus,
    report_of,
    resume,
    saved_plan,
    state_message,
    start_manual,
    wait_for,
    xid79_log,
)
from lab.rig import drained_nodes
from testkit.services.slurm import SlurmLab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

REFUSED = "does not extend its stored copy"
SCENARIO = FIXTURES / "withheld_one"


def _evidence(rig: FlowRig, incident: str) -> str:
    return upload(rig.s3_endpoint, evidence_prefix(incident), SCENARIO,
                  extra={"manifest.json": manifest_with_gpus(SCENARIO), "kernel.log": xid79_log()})


def _copy(rig: FlowRig) -> Path:
    return rig.state_dir / "audit-store" / "lab" / "audit.jsonl"


def _stored(rig: FlowRig) -> list[AuditRecord]:
    path = _copy(rig)
    assert path.exists(), f"no stored copy of the audit log at {path}"
    return AuditLog(path).records()


class Cutter:
    """Cuts the session's keyed log at a record boundary, and puts it back afterwards."""

    def __init__(self, log: AuditLog) -> None:
        self.log = log
        self.before: bytes | None = None

    def cut_before(self, seq: int) -> None:
        """The chain still verifies after the cut: only the stored copy shows it."""
        self.before = self.log.path.read_bytes()
        lines = self.before.splitlines(keepends=True)
        self.log.path.write_bytes(b"".join(lines[:seq - 1]))
        self.log.verify()


@pytest.fixture
def cutter(flow_rig: FlowRig) -> Iterator[Cutter]:
    """The log as it stood before the cut is put back, so the session's later tests find it
    extending the stored copy again (the refusals written meanwhile were never copied)."""
    cut = Cutter(state_audit_log(flow_rig.state_dir))
    yield cut
    if cut.before is not None:
        cut.log.path.write_bytes(cut.before)


def _answer(run_id: UUID, rig: FlowRig, incident: str, **answer: Any) -> None:
    plan = saved_plan(rig.state_dir, incident)
    resume(run_id, {"plan_hash": plan.content_hash(), "nodes": [a.node for a in plan.actions], "comment": "",
                    **answer}, state_dir=rig.state_dir)


def _triage(rig: FlowRig, incident: str, **answer: Any) -> dict[str, Any]:
    run_id = start_manual(alert(incident, _evidence(rig, incident)))
    wait_for(run_id, {"PAUSED"})
    _answer(run_id, rig, incident, **answer)
    wait_for(run_id, {"COMPLETED"})
    return report_of(rig.state_dir, incident, run_id)


def test_a_log_cut_back_before_a_rejection_stops_the_next_incidents_drain(
        flow_rig: FlowRig, lab: SlurmLab, cutter: Cutter) -> None:
    first, second = "inc-cut-rejected", "inc-cut-next"
    report = _triage(flow_rig, first, decision="reject", approver="bob", comment="job owner is debugging")
    assert report["outcome"] == "rejected"
    [decision] = [r for r in cutter.log.records() if r.incident_id == first and r.kind is AuditKind.DECISION]

    cutter.cut_before(decision.seq)  # the rejection is gone; the chain still holds
    report = _triage(flow_rig, second, decision="approve", approver="alice", comment="Xid 79")
    assert report["outcome"] == "failed", report["reason"]
    assert REFUSED in report["reason"] and "cut back" in report["reason"], report["reason"]
    assert drained_nodes(lab) == set()
    mine = [r for r in cutter.log.records() if r.incident_id == second]
    # The page's approval, then the execution's refusal; no intent: nothing sent.
    assert [(r.kind, r.action) for r in mine] == [(AuditKind.DECISION, "approved"), (AuditKind.DECISION, "refused")]
    assert REFUSED in mine[1].message
    # The rejection is in the stored copy, which kept it: the refusal was not copied over it.
    assert decision in _stored(flow_rig)
    assert all(r.incident_id != second for r in _stored(flow_rig))


def test_return_to_service_checks_the_log_against_its_copy(flow_rig: FlowRig, lab: SlurmLab,
                                                          cutter: Cutter) -> None:
    from prefect.deployments import run_deployment

    incident = "inc-cut-rts"
    report = _triage(flow_rig, incident, decision="approve", approver="alice", comment="Xid 79")
    assert report["outcome"] == "executed", report["reason"]
    assert drained_nodes(lab) == {CULPRIT_NODE}
    approved, intent, result = [r for r in cutter.log.records() if r.incident_id == incident]
    assert (approved.kind, intent.kind, result.kind) == (AuditKind.DECISION, AuditKind.INTENT, AuditKind.RESULT)

    cutter.cut_before(intent.seq)  # the drain's records are gone
    run = run_deployment("denpex-return-to-service/return-to-service",
                         parameters={"cluster": "lab", "incident_id": incident}, timeout=0)
    wait_for(run.id, {"PAUSED"})
    _answer(run.id, flow_rig, incident, decision="approve", approver="alice", comment="board replaced")
    assert wait_for(run.id, {"COMPLETED", "FAILED"}) == "FAILED"
    assert REFUSED in state_message(run.id), state_message(run.id)
    assert drained_nodes(lab) == {CULPRIT_NODE}  # the rollback touched nothing
    kept, rollback_approved, refusal = [r for r in cutter.log.records() if r.incident_id == incident]
    assert kept == approved and (rollback_approved.action, rollback_approved.operation.value) == ("approved", "rollback")
    assert (refusal.kind, refusal.action, refusal.operation.value) == (AuditKind.DECISION, "refused", "rollback")
    assert result in _stored(flow_rig)  # the drain extended the cluster's copy, which still shows it


def test_a_timed_out_decision_is_in_the_stored_copy(flow_rig: FlowRig, lab: SlurmLab) -> None:
    incident = "inc-copy-timeout"
    register_blocks(lab, runbook="hang-triage-quick")
    try:
        run_id = start_manual(alert(incident, _evidence(flow_rig, incident)))
        wait_for(run_id, {"COMPLETED", "FAILED"}, timeout_s=120)
    finally:
        register_blocks(lab)
    assert report_of(flow_rig.state_dir, incident, run_id)["outcome"] == "timed_out"
    stored = [r for r in _stored(flow_rig) if r.incident_id == incident]
    assert [(r.kind, r.action) for r in stored] == [(AuditKind.DECISION, "timed_out")]
    assert stored == [r for r in keyed_audit_log(flow_rig.state_dir).records() if r.incident_id == incident]
