"""A decision the flow records (a rejection, a withdrawn plan) keeps the keyed audit chain whole."""

from __future__ import annotations

from pathlib import Path

from denpex.isolation.audit import AuditKind, verify_audit_log
from denpex.isolation.operator import AUDIT_KEY_NAME, state_audit_log
from denpex.isolation.plan import Operation, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import IsolationPolicy, Scheduler
from denpex.workflow.decision_audit import record_decision
from lab.rig import xid79_on


def test_a_decision_is_keyed_so_a_later_execution_accepts_the_log(tmp_path: Path) -> None:
    result = xid79_on(["gpu-node-002"])
    plan = plan_isolation(result, None, IsolationPolicy(), None, Scheduler.SLURM, "inc-9",
                          result.as_of or utc_now(), cluster="lab", tenant="acme")
    record_decision(state_audit_log(tmp_path), plan, operation=Operation.ISOLATE, outcome="rejected",
                    reason="not this node", approver="alice", at=utc_now())
    key = bytes.fromhex((tmp_path / AUDIT_KEY_NAME).read_text().strip())
    verification = verify_audit_log(tmp_path / "audit.jsonl", key=key)
    assert verification.ok, verification.problems
    log = state_audit_log(tmp_path)
    log.verify()  # what denpex.isolation.run.execute does before it acts
    [record] = log.records()
    assert record.kind is AuditKind.DECISION and record.mac == record.expected_mac(key)
