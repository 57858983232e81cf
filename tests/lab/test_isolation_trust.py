"""Issue 8 on the real Slurm lab: what an attacker with a plan file, a name, another operator's
working directory or write access to the audit log can no longer make Denpex do.

Each CLI refusal is exit 2 with one clear line on stderr, and no node changes.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from denpex.cli import app
from denpex.isolation.audit import AuditRecord, verify_audit_log
from denpex.isolation.errors import ApprovalError, AuditChainError, PolicyMismatchError
from denpex.isolation.run.report import NodeDecision
from denpex.isolation.plan import IsolationPlan, save_plan, utc_now
from denpex.isolation.policy import IsolationPolicy, SafetyLimits
from denpex.isolation.ssh import SshSettings
from isolation.trust import APPROVERS_FILE, key_file, signed
from lab.rig import CLUSTER, Rig, drained, drained_nodes, xid79, xid79_on

pytestmark = pytest.mark.slow

runner = CliRunner()


def settings_file(path: Path, ssh: SshSettings, state_dir: Path | str, **extra: object) -> Path:
    path.write_text(yaml.safe_dump({
        "ssh": {"host": ssh.host, "port": ssh.port, "key_path": str(ssh.key_path),
                "known_hosts": str(ssh.known_hosts), "backoff": {"attempts": 2, "initial_s": 0.05}},
        "state_dir": str(state_dir), "trusted_approvers": str(APPROVERS_FILE), "verify_timeout_s": 10,
        **extra,
    }))
    return path


def approve(plan_path: Path, name: str = "alice", *extra: str) -> None:
    done = runner.invoke(app, ["approve", str(plan_path), "--approver", name, "--key", key_file(name), *extra])
    assert done.exit_code == 0, done.output


def refused(args: list[str], needle: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("denpex: error: "), result.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


# -- item 1: the plan file carries no policy of its own ------------------------------------


def test_an_edited_plan_cannot_bring_its_own_policy(rig: Rig, ssh_settings: SshSettings, tmp_path: Path) -> None:
    """The review's attack: raise the limits, clear the allowlist, then have it signed."""
    nodes = [f"gpu-node-{i:03d}" for i in range(1, 9)]
    lax = IsolationPolicy(limits=SafetyLimits(max_nodes_per_incident=100, max_isolated_fraction=1.0,
                                              max_isolations_per_cluster_per_hour=100))
    plan = rig.plan(xid79_on(nodes), policy=lax)
    assert len(plan.actions) == 8
    plan_path = tmp_path / "plan.json"
    save_plan(plan, plan_path)
    approve(plan_path)  # even a real approver's signature does not make the plan's policy trusted
    config = settings_file(tmp_path / "s.yaml", ssh_settings, tmp_path / "state")
    refused(["isolate", str(plan_path), "--execute", "--config", str(config)],
            "the plan's policy differs from the operator's runbook (limits)")
    with pytest.raises(PolicyMismatchError):
        rig.execute(plan, policy=IsolationPolicy())
    assert drained_nodes(rig.lab) == set()


@pytest.mark.parametrize("edit", ["verdict", "evidence", "steps", "reason"])
def test_a_plan_whose_actions_the_evidence_does_not_support_is_refused(rig: Rig, edit: str) -> None:
    node = "gpu-node-009"
    plan = rig.plan(xid79(node))
    [action] = plan.actions
    changed: dict[str, object] = {
        "verdict": {"verdict": "no_hang"},
        "evidence": {"actions": (action.model_copy(update={"evidence": ()}),)},
        "steps": {"actions": (action.model_copy(update={"post_checks": ()}),)},
        "reason": {"actions": (action.model_copy(update={"reason": "bad DIMM ticket 881"}),)},
    }[edit]
    edited = plan.model_copy(update=changed)
    needle = {"verdict": "verdict 'no_hang' names no culprit", "evidence": "has no supporting evidence",
              "steps": "steps are not the runbook's", "reason": "reason does not start with 'denpex:inc-lab'"}[edit]
    with pytest.raises(PolicyMismatchError, match=needle):
        rig.execute(edited, approval=signed(edited))
    assert not drained(rig.lab, node) and not rig.audit.path.exists()


# -- item 2: authenticated approvals ---------------------------------------------------------


def test_unauthenticated_or_foreign_approvals_act_on_nothing(rig: Rig, ssh_settings: SshSettings,
                                                            tmp_path: Path) -> None:
    node = "gpu-node-012"
    plan_path = tmp_path / "plan.json"
    plan = rig.plan(xid79(node))
    save_plan(plan, plan_path)
    config = settings_file(tmp_path / "s.yaml", ssh_settings, tmp_path / "state")
    execute = ["isolate", str(plan_path), "--execute", "--config", str(config)]

    # A free-text name, the way approvals used to be written.
    approval_path = tmp_path / "plan.approval.json"
    approval_path.write_text(json.dumps({"plan_hash": plan.content_hash(), "incident_id": plan.incident_id,
                                         "approver": "alice", "approved_at": "2026-12-01T00:00:00Z",
                                         "expires_at": "2099-01-01T00:00:00Z"}))
    refused(execute, "not a valid approval")
    # Signed by a key the operator does not trust, in alice's name.
    approval_path.write_text(signed(plan, "alice", key="mallory").model_dump_json())
    refused(execute, "the signature does not verify with 'alice'")
    # Signed by mallory as herself.
    approve(plan_path, "mallory")
    refused(execute, "no trusted key is configured for 'mallory'")
    # A genuine approval for another cluster (the plan was made offline, without one).
    offline = tmp_path / "offline.json"
    save_plan(plan.model_copy(update={"cluster": None}), offline)
    approve(offline, "alice", "--cluster", "prod-a")
    refused(["isolate", str(offline), "--execute", "--config", str(config)],
            "approved this plan for cluster 'prod-a', but the settings reach cluster 'lab'")
    assert not drained(rig.lab, node) and not (tmp_path / "state" / "audit.jsonl").exists()

    approve(plan_path, "bob")
    done = runner.invoke(app, execute)
    assert done.exit_code == 0, done.output
    assert drained(rig.lab, node) and "approved by bob" in done.stdout


def test_only_the_approved_nodes_are_acted_on(rig: Rig) -> None:
    nodes = ["gpu-node-013", "gpu-node-014"]
    roomy = IsolationPolicy(limits=SafetyLimits(max_isolated_fraction=0.5))
    plan = rig.plan(xid79_on(nodes), policy=roomy)
    report = rig.execute(plan, approval=signed(plan, nodes=["gpu-node-014"]))
    assert [n.node for n in report.nodes] == ["gpu-node-014"]
    assert drained_nodes(rig.lab) == {"gpu-node-014"}


# -- item 3: one machine-wide state ----------------------------------------------------------


def test_a_relative_state_dir_is_refused_with_execute(rig: Rig, ssh_settings: SshSettings, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    node = "gpu-node-015"
    plan_path = tmp_path / "plan.json"
    save_plan(rig.plan(xid79(node)), plan_path)
    approve(plan_path)
    monkeypatch.chdir(tmp_path)
    relative = settings_file(tmp_path / "rel.yaml", ssh_settings, "state")
    refused(["isolate", str(plan_path), "--execute", "--config", str(relative)],
            "the state directory 'state' is relative")
    absent = settings_file(tmp_path / "env.yaml", ssh_settings, "/placeholder")
    absent.write_text(absent.read_text().replace("state_dir: /placeholder\n", ""))
    monkeypatch.setenv("DENPEX_STATE_DIR", "denpex-state")
    refused(["isolate", str(plan_path), "--execute", "--config", str(absent)],
            "the state directory 'denpex-state' is relative")
    assert not drained(rig.lab, node) and not (tmp_path / "state").exists()


def test_two_operators_in_different_directories_share_one_breaker(rig: Rig, ssh_settings: SshSettings,
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "machine-state"
    monkeypatch.setenv("DENPEX_STATE_DIR", str(state))
    for who in ("one", "two"):
        (tmp_path / who).mkdir()
    rig.lab.run(["scontrol", "update", "NodeName=gpu-node-001", "State=DRAIN", "Reason=cable swap"])
    rig.lab.run(["scontrol", "update", "NodeName=gpu-node-002", "State=DRAIN", "Reason=cable swap"])
    plan_path = tmp_path / "plan.json"
    save_plan(rig.plan(xid79("gpu-node-003"), live_facts=False), plan_path)
    approve(plan_path)
    monkeypatch.chdir(tmp_path / "one")
    config = settings_file(tmp_path / "s.yaml", ssh_settings, "/placeholder")
    config.write_text(config.read_text().replace("state_dir: /placeholder\n", ""))
    first = runner.invoke(app, ["isolate", str(plan_path), "--execute", "--config", str(config)])
    assert first.exit_code == 4 and "TRIPPED" in first.stdout
    monkeypatch.chdir(tmp_path / "two")
    status = runner.invoke(app, ["breaker", "status", "--config", str(config)])
    assert '"tripped": true' in status.stdout
    assert (state / "breaker.json").exists() and (state / "audit.jsonl").exists()
    assert not list((tmp_path / "one").iterdir()) and not list((tmp_path / "two").iterdir())


# -- item 6: the audit chain is enforced ----------------------------------------------------


def _records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write(path: Path, records: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records))


def _rechain(records: list[dict[str, object]]) -> list[dict[str, object]]:
    """What a forger with write access to the log does: recompute every hash by hand."""
    previous = "0" * 64
    for body in records:
        body["prev_hash"] = previous
        body["hash"] = ""
        body["hash"] = AuditRecord.model_validate(body).expected_hash()
        previous = str(body["hash"])
    return records


@pytest.mark.parametrize("tamper", ["edited", "rechained", "truncated"])
def test_a_broken_or_non_extending_audit_log_stops_execution(rig: Rig, ssh_settings: SshSettings,
                                                             tmp_path: Path, tamper: str) -> None:
    first, second = "gpu-node-004", "gpu-node-005"
    state = tmp_path / "state"
    config = settings_file(tmp_path / "s.yaml", ssh_settings, state, evidence_store=str(tmp_path / "store"))
    plan_path = tmp_path / "first.json"
    save_plan(rig.plan(xid79(first)), plan_path)
    approve(plan_path)
    for _ in range(2):  # intent and result, then a skip: three records, copied to the store
        done = runner.invoke(app, ["isolate", str(plan_path), "--execute", "--config", str(config)])
        assert done.exit_code == 0, done.output
    log = state / "audit.jsonl"
    records = _records(log)
    assert len(records) == 3 and all(r["mac"] for r in records)
    if tamper == "edited":
        records[1]["approver"] = "nobody"
        _write(log, records)
        needle = "content does not match its hash"
    elif tamper == "rechained":
        records[1]["approver"] = "nobody"
        _write(log, _rechain(records))
        assert verify_audit_log(log).ok  # the unkeyed chain is whole again ...
        needle = "its mac does not verify"  # ... the keyed one is not
    else:
        _write(log, records[:2])  # cut at a record boundary: the chain still holds
        assert verify_audit_log(log).ok
        needle = "does not extend its stored copy"
    before = log.read_bytes()
    plan_path = tmp_path / "plan.json"
    save_plan(rig.plan(xid79(second)), plan_path)
    approve(plan_path)
    line = refused(["isolate", str(plan_path), "--execute", "--config", str(config)], needle)
    assert "nothing was done" in line
    assert not drained(rig.lab, second)
    if tamper == "truncated":  # the chain holds, so the refusal is recorded in it; nothing else is
        assert log.read_bytes().startswith(before)
        assert [(r["kind"], r["action"]) for r in _records(log)[2:]] == [("decision", "refused")]
    else:  # a broken chain is never written to
        assert log.read_bytes() == before
    if tamper == "rechained":
        verify = runner.invoke(app, ["audit", "verify", str(log), "--key", str(state / "audit.key")])
        assert verify.exit_code == 2 and "mac does not verify" in verify.stderr
    # The stored copy was never replaced by the tampered log.
    stored = tmp_path / "store" / "audit" / "inc-lab" / "audit.jsonl"
    assert len(_records(stored)) == 3 and _records(stored)[1]["approver"] == "alice"


def test_the_audit_key_lives_outside_the_log_readable_by_its_owner_only(rig: Rig, tmp_path: Path) -> None:
    node = "gpu-node-006"
    rig.execute(rig.plan(xid79(node)))
    key = rig.state_dir / "audit.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.read_text().strip() not in rig.audit.path.read_text()
    key.chmod(0o644)
    with pytest.raises(AuditChainError, match="accessible to group or others"):
        rig.execute(rig.plan(xid79(node)))


# -- item 10: hang storms --------------------------------------------------------------------


def test_a_storm_of_incidents_trips_the_per_cluster_rate_limit(rig: Rig) -> None:
    hourly = IsolationPolicy(limits=SafetyLimits(max_isolations_per_cluster_per_hour=2, max_isolated_fraction=0.5))
    applied = []
    for index, node in enumerate(["gpu-node-007", "gpu-node-008", "gpu-node-009"]):
        plan = rig.plan(xid79(node), policy=hourly)
        # A separate incident each time, each within its own per-incident limit.
        plan = plan.model_copy(update={"incident_id": f"inc-storm-{index}", "actions": tuple(
            a.model_copy(update={"reason": a.reason.replace("denpex:inc-lab", f"denpex:inc-storm-{index}")})
            for a in plan.actions)})
        report = rig.execute(plan)
        applied.append(report.nodes[0].decision)
        if index == 2:
            assert report.breaker_tripped
            assert "2 isolation(s) on this cluster in the last hour plus 1 now is over the limit of 2" in report.blocked[0]
    assert applied == [NodeDecision.ACT, NodeDecision.ACT, NodeDecision.BLOCKED]
    assert drained_nodes(rig.lab) == {"gpu-node-007", "gpu-node-008"}
    assert rig.breaker.state().tripped
    assert [m.node for m in rig.breaker.state().isolations_since(CLUSTER, rig.breaker.state().isolations[0].at
                                                                - timedelta(seconds=1))] == ["gpu-node-007", "gpu-node-008"]


def test_approval_errors_are_refusals_not_transient() -> None:
    from denpex.isolation.errors import BusyError, RefusedError, TransientRemoteError, is_transient

    assert issubclass(ApprovalError, RefusedError) and issubclass(PolicyMismatchError, RefusedError)
    assert issubclass(AuditChainError, RefusedError)
    assert not is_transient(ApprovalError("x")) and not is_transient(AuditChainError("x"))
    assert is_transient(TransientRemoteError("x")) and is_transient(BusyError("x"))


# -- review: a prefect-ui approval is only as good as the flow run that was resumed -----------


def test_a_prefect_ui_approval_written_to_a_file_is_refused_by_the_cli(rig: Rig, ssh_settings: SshSettings,
                                                                     tmp_path: Path) -> None:
    """Whoever can write beside a plan can write a 'prefect-ui' record naming a listed approver and
    any flow run id: no signature, no resumed flow run. The CLI takes signed approvals only."""
    from denpex.isolation.approval import save_approval, ui_approval
    from denpex.isolation.policy import ApprovalRule
    from isolation.trust import write_runbook

    node = "gpu-node-010"
    policy = IsolationPolicy(approval=ApprovalRule(approvers=frozenset({"alice"})))
    plan = rig.plan(xid79(node), policy=policy)
    plan_path = tmp_path / "plan.json"
    save_plan(plan, plan_path)
    forged = ui_approval(plan, "alice", flow_run_id="00000000-0000-0000-0000-000000000000", at=utc_now(),
                         ttl=policy.approval.ttl)
    save_approval(forged, tmp_path / "plan.approval.json")
    config = settings_file(tmp_path / "s.yaml", ssh_settings, tmp_path / "state",
                           runbook=str(write_runbook(tmp_path / "runbook.yaml", policy)))
    refused(["isolate", str(plan_path), "--execute", "--config", str(config)],
            "prefect-ui approval")
    assert not drained(rig.lab, node) and not (tmp_path / "state" / "audit.jsonl").exists()


def test_a_dry_run_writes_nothing_in_the_state_directory(rig: Rig, ssh_settings: SshSettings,
                                                         tmp_path: Path) -> None:
    """A dry run reads the machine-wide breaker (so its state dir must be the absolute, shared one)
    but creates nothing there: an operator without write access to it can still dry-run."""
    node = "gpu-node-011"
    plan_path = tmp_path / "plan.json"
    save_plan(rig.plan(xid79(node)), plan_path)
    state = tmp_path / "state"
    config = settings_file(tmp_path / "s.yaml", ssh_settings, state)
    done = runner.invoke(app, ["isolate", str(plan_path), "--dry-run", "--config", str(config)])
    assert done.exit_code == 0, done.output
    assert "WOULD run: scontrol update NodeName=gpu-node-011 State=DRAIN" in done.stdout
    assert not state.exists() and not drained(rig.lab, node)
    # A tripped breaker in the shared state is seen by the dry run, which still writes nothing.
    rig.breaker.path = state / "breaker.json"
    rig.breaker.trip(reason="storm", incident_id="inc-other", at=utc_now())
    before = sorted(p.name for p in state.iterdir())
    blocked = runner.invoke(app, ["isolate", str(plan_path), "--dry-run", "--config", str(config)])
    assert blocked.exit_code == 4 and "breaker" in blocked.stdout, blocked.output
    assert sorted(p.name for p in state.iterdir()) == before


def _other_incident(plan: IsolationPlan, incident: str) -> IsolationPlan:
    return plan.model_copy(update={"incident_id": incident, "actions": tuple(
        a.model_copy(update={"reason": a.reason.replace("denpex:inc-lab", f"denpex:{incident}")})
        for a in plan.actions)})


@pytest.mark.parametrize("tamper", ["truncated", "deleted"])
def test_a_cut_or_deleted_audit_log_stops_the_next_incident_too(rig: Rig, ssh_settings: SshSettings,
                                                                tmp_path: Path, tamper: str) -> None:
    """The stored copy of incident A's run protects the log when incident B runs next: a log cut at
    a record boundary (or removed) still chains, and B has no copy of its own yet."""
    state = tmp_path / "state"
    config = settings_file(tmp_path / "s.yaml", ssh_settings, state, evidence_store=str(tmp_path / "store"))
    first = tmp_path / "first.json"
    save_plan(rig.plan(xid79("gpu-node-004")), first)
    approve(first)
    done = runner.invoke(app, ["isolate", str(first), "--execute", "--config", str(config)])
    assert done.exit_code == 0, done.output
    log = state / "audit.jsonl"
    if tamper == "truncated":
        _write(log, _records(log)[:1])
        assert verify_audit_log(log, key=bytes.fromhex((state / "audit.key").read_text().strip())).ok
    else:
        log.unlink()
    second = tmp_path / "second.json"
    save_plan(_other_incident(rig.plan(xid79("gpu-node-005")), "inc-other"), second)
    approve(second)
    line = refused(["isolate", str(second), "--execute", "--config", str(config)], "does not extend its stored copy")
    assert "nothing was done" in line and not drained(rig.lab, "gpu-node-005")


def test_a_plan_edited_after_its_approval_is_refused(rig: Rig, ssh_settings: SshSettings, tmp_path: Path) -> None:
    """The plan file is rewritten after a person approved it, to drain another node: exit 2, one
    line, nothing drained, nothing written to the audit log."""
    plan = rig.plan(xid79("gpu-node-001"))
    plan_path = tmp_path / "plan.json"
    save_plan(plan, plan_path)
    approve(plan_path)
    [action] = plan.actions
    edited = plan.model_copy(update={"actions": (action.model_copy(update={"node": "gpu-node-016"}),)})
    save_plan(edited, plan_path)
    config = settings_file(tmp_path / "s.yaml", ssh_settings, tmp_path / "state")
    line = refused(["isolate", str(plan_path), "--execute", "--config", str(config)],
                   "the plan changed after approval")
    assert "execution refused" in line
    assert drained_nodes(rig.lab) == set() and not (tmp_path / "state" / "audit.jsonl").exists()
