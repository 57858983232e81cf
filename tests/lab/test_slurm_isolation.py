"""Isolation on a real Slurm (slurmctld + 16 slurmd) through a real sshd, with fault injection.

Each test uses its own node so that one test's leftovers (a resumed node shows
``IDLE+NOT_RESPONDING`` for a few seconds) never change another's expectations.
"""

from __future__ import annotations

import json
import signal as signals
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from denpex.cli import app
from denpex.isolation.audit import AuditEntry, AuditKind, AuditLog, Outcome, verify_audit_log
from denpex.isolation.errors import ApprovalError, HostKeyError, RemoteAuthError, TransientRemoteError
from denpex.isolation.run.report import NodeDecision
from denpex.isolation.plan import Gate, Operation, save_plan, utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import IsolationPolicy, SafetyLimits, Scheduler
from denpex.isolation.ssh import CommandRunner, SshSettings
from isolation.triage_cases import killed_process
from isolation.trust import APPROVERS_FILE, key_file, signed, write_runbook
from lab.rig import INCIDENT, Hooked, Rig, drained, drained_nodes, proxied, reason_of, rig_for, xid79, xid79_on
from testkit.services.slurm import SlurmLab
from testkit.services.tcp_proxy import Fault, FaultProxy

pytestmark = pytest.mark.slow


# -- the done-when cases ------------------------------------------------------------------


def test_killed_process_without_telemetry_drains_nothing_and_says_why(rig: Rig) -> None:
    before = drained_nodes(rig.lab)
    plan = rig.plan(killed_process(host="gpu-node-002", as_of=utc_now()))
    assert plan.contract_view() == {
        "recommend_isolation": False, "actions": [],
        "blocked": ["rank 1 stopped reporting and no hardware signal supports a fault on gpu-node-002"],
    }
    report = rig.execute(plan)
    assert report.nodes == [] and not report.failed
    assert drained_nodes(rig.lab) == before == set()
    assert not rig.audit.records()


def test_xid79_drains_exactly_that_node_approved_verified_audited(rig: Rig) -> None:
    node = "gpu-node-003"
    plan = rig.plan(xid79(node))
    assert plan.contract_view()["actions"] == [{"node": node, "action": "drain"}]
    sent_before = rig.lab.update_rpc_count(node)

    approval = signed(plan, "alice", comment="Xid 79 confirmed by on-call")
    report = rig.execute(plan, approval=approval)

    [outcome] = report.nodes
    assert outcome.outcome is Outcome.APPLIED and outcome.rc == 0
    assert "DRAIN" in outcome.state_after.split("+")
    assert drained_nodes(rig.lab) == {node}
    assert reason_of(rig.lab, node).startswith("denpex:inc-lab rank 1: xid 79 at ")
    assert rig.lab.update_rpc_count(node) - sent_before == 1

    assert verify_audit_log(rig.audit.path).ok
    intent, result = rig.audit.records()
    assert (intent.kind, result.kind) == (AuditKind.INTENT, AuditKind.RESULT)
    for record in (intent, result):
        assert record.approver == "alice" and record.plan_hash == plan.content_hash()
        assert record.command == outcome.command and "State=DRAIN" in record.command
    assert result.intent_seq == intent.seq and result.rc == 0 and result.outcome is Outcome.APPLIED
    assert result.state == outcome.state_after
    assert report.audit_copy is not None
    assert (rig.store / "audit" / INCIDENT / "audit.jsonl").read_bytes() == rig.audit.path.read_bytes()

    # A second run is a no-op: nothing is sent, the skip is audited.
    again = rig.execute(plan, approval=approval)
    assert [(n.decision, n.outcome) for n in again.nodes] == [(NodeDecision.ALREADY_DONE, Outcome.ALREADY_DONE)]
    assert rig.lab.update_rpc_count(node) - sent_before == 1
    assert rig.audit.records()[-1].kind is AuditKind.SKIP


def test_drain_lets_the_running_job_finish(rig: Rig) -> None:
    node = "gpu-node-016"
    job = rig.lab.submit_sleep(node)
    plan = rig.plan(xid79(node))
    assert plan.actions[0].running_jobs == (job,)
    report = rig.execute(plan)
    [outcome] = report.nodes
    assert outcome.outcome is Outcome.APPLIED
    assert rig.lab.state_of(node) in ("MIXED+DRAIN", "ALLOCATED+DRAIN")
    assert rig.lab.job_state(job) == "RUNNING"
    assert outcome.running_jobs == (job,) and "keep running" in outcome.message
    intent = rig.audit.records()[0]
    assert intent.running_jobs == (job,)


def test_drain_then_resume_over_real_ssh(rig: Rig) -> None:
    node = "gpu-node-001"
    sent_before = rig.lab.update_rpc_count(node)
    plan = rig.plan(xid79(node))
    assert rig.execute(plan).nodes[0].outcome is Outcome.APPLIED
    assert drained(rig.lab, node)

    back = rig.execute(plan, operation=Operation.ROLLBACK)
    [outcome] = back.nodes
    assert outcome.outcome is Outcome.APPLIED and outcome.command.endswith("State=RESUME")
    assert not drained(rig.lab, node)
    # RESUME on a node that is not drained fails in Slurm (rc 1): a second rollback sends nothing.
    again = rig.execute(plan, operation=Operation.ROLLBACK)
    assert again.nodes[0].decision is NodeDecision.ALREADY_DONE
    assert rig.lab.update_rpc_count(node) - sent_before == 2
    assert verify_audit_log(rig.audit.path).ok


# -- gates on the live cluster ------------------------------------------------------------


def test_foreign_drain_is_never_overwritten_or_undone(rig: Rig) -> None:
    node = "gpu-node-004"
    approved_earlier = rig.plan(xid79(node))
    rig.lab.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=bad DIMM, ticket 881"])

    replanned = rig.plan(xid79(node))
    assert replanned.actions == () and [b.gate for b in replanned.blocked] == [Gate.FOREIGN_REASON]

    report = rig.execute(approved_earlier)
    assert [(n.decision, n.outcome) for n in report.nodes] == [(NodeDecision.BLOCKED, Outcome.BLOCKED)]
    assert "someone else" in report.nodes[0].message
    back = rig.execute(approved_earlier, operation=Operation.ROLLBACK)
    assert back.nodes[0].decision is NodeDecision.BLOCKED
    assert drained(rig.lab, node) and reason_of(rig.lab, node).startswith("bad DIMM, ticket 881 [root@")


@pytest.mark.parametrize("how", ["policy-list", "node-feature"])
def test_opt_out_node_is_never_touched(rig: Rig, how: str) -> None:
    node = "gpu-node-005"
    sent_before = rig.lab.update_rpc_count(node)
    if how == "policy-list":
        policy = IsolationPolicy(limits=SafetyLimits(opt_out_nodes=frozenset({node})))
        plan = rig.plan(xid79(node), policy=policy)
        assert plan.actions == () and plan.blocked[0].gate is Gate.OPT_OUT
    else:
        plan = rig.plan(xid79(node), live_facts=False)  # planned offline, before the marker was set
        rig.lab.set_opt_out(node)
        report = rig.execute(plan)
        assert report.nodes[0].decision is NodeDecision.BLOCKED
        assert "opt-out" in report.nodes[0].message
    assert not drained(rig.lab, node)
    assert rig.lab.update_rpc_count(node) - sent_before == (1 if how == "node-feature" else 0)  # the feature update


def test_an_admin_comment_cannot_hide_the_opt_out_feature(rig: Rig) -> None:
    # `scontrol -o` prints Comment and Extra (free text) after every other field; text such as
    # "AvailableFeatures=gpu" inside them must not read as the node's own fields.
    node = "gpu-node-002"
    rig.lab.set_opt_out(node)
    rig.lab.run(["scontrol", "update", f"NodeName={node}",
                 "Comment=was: AvailableFeatures=gpu State=IDLE Partitions=debug"])
    facts = rig.adapter.node_facts(node)
    assert facts.opted_out and facts.partitions == ("gpu",)
    report = rig.execute(rig.plan(xid79(node), live_facts=False))
    assert report.nodes[0].decision is NodeDecision.BLOCKED and "opt-out" in report.nodes[0].message
    assert not drained(rig.lab, node)


def test_circuit_breaker_trips_on_drains_by_anyone_and_needs_a_person(rig: Rig) -> None:
    node = "gpu-node-006"
    offline = rig.plan(xid79(node), live_facts=False)
    for other in ("gpu-node-010", "gpu-node-011"):
        rig.lab.run(["scontrol", "update", f"NodeName={other}", "State=DRAIN", "Reason=cable swap"])

    live = rig.plan(xid79(node))
    assert live.actions == () and "3 of 16 nodes isolated (19%, 2 already isolated by anyone)" in live.breaker_trip

    report = rig.execute(offline)
    assert report.breaker_tripped and report.nodes[0].decision is NodeDecision.BLOCKED
    assert not drained(rig.lab, node)
    assert rig.breaker.state().tripped
    assert rig.audit.records()[0].kind is AuditKind.BREAKER

    # The person's drains end; the breaker stays open until a person resets it.
    for other in ("gpu-node-010", "gpu-node-011"):
        rig.lab.run(["scontrol", "update", f"NodeName={other}", "State=RESUME"])
    still = rig.execute(offline)
    assert "circuit breaker is tripped" in still.nodes[0].message and not drained(rig.lab, node)

    rig.breaker.reset(by="bob", at=utc_now())
    assert rig.execute(offline).nodes[0].outcome is Outcome.APPLIED
    assert drained(rig.lab, node)


def test_stale_evidence_is_not_acted_on(rig: Rig) -> None:
    node = "gpu-node-007"
    stale_signal = rig.plan(xid79(node, age=timedelta(hours=3)))
    assert stale_signal.actions == () and stale_signal.blocked[0].gate is Gate.STALE_EVIDENCE
    assert "stale evidence does not isolate a node" in stale_signal.blocked[0].message

    old = rig.plan(xid79(node, as_of=utc_now() - timedelta(hours=7)))
    assert old.recommend_isolation  # fresh relative to its own time ...
    with pytest.raises(ApprovalError, match="triage again before acting"):
        rig.execute(old, approval=signed(old, "alice"))  # ... but too old to act on now
    assert not drained(rig.lab, node) and not rig.audit.records()


def test_an_approval_for_another_cluster_is_refused_before_anything_is_sent(rig: Rig) -> None:
    node = "gpu-node-007"
    sent_before = rig.lab.update_rpc_count(node)
    plan = rig.plan(xid79(node)).model_copy(update={"cluster": None})  # planned offline
    elsewhere = signed(plan, "alice", cluster="prod-a")
    with pytest.raises(ApprovalError, match="approved this plan for cluster 'prod-a', but the settings reach cluster 'lab'"):
        rig.execute(plan, approval=elsewhere)
    assert not drained(rig.lab, node) and not rig.audit.path.exists()
    assert rig.lab.update_rpc_count(node) == sent_before
    here = signed(plan, "alice", cluster="lab")
    assert rig.execute(plan, approval=here).nodes[0].outcome is Outcome.APPLIED


def test_dry_run_checks_everything_and_changes_nothing(rig: Rig) -> None:
    node = "gpu-node-008"
    sent_before = rig.lab.update_rpc_count(node)
    plan = rig.plan(xid79(node))
    report = rig.dry_run(plan)
    [outcome] = report.nodes
    assert outcome.decision is NodeDecision.ACT and outcome.outcome is None
    assert outcome.command.startswith(f"scontrol update NodeName={node} State=DRAIN 'Reason=denpex:inc-lab rank 1: ")

    tight = rig.plan(xid79(node), policy=IsolationPolicy(limits=SafetyLimits(max_isolated_fraction=0.01)),
                     live_facts=False)
    blocked = rig.dry_run(tight)
    assert blocked.blocked and not blocked.breaker_tripped and not rig.breaker.state().tripped
    assert not drained(rig.lab, node) and rig.lab.update_rpc_count(node) == sent_before
    assert not rig.audit.path.exists()


def test_the_reason_reaches_slurm_verbatim_and_no_shell_interprets_it(rig: Rig, tmp_path: Path) -> None:
    node = "gpu-node-003"
    mark = tmp_path / "interpreted"
    evil = (f"denpex:{INCIDENT} rank 1: $(touch {mark}) `touch {mark}`; touch {mark} && echo |"
            f" 'quoted' \\ * ~ >{mark}")
    plan = rig.plan(xid79(node))
    plan = plan.model_copy(update={"actions": (plan.actions[0].model_copy(update={"reason": evil}),)})
    assert rig.execute(plan).nodes[0].outcome is Outcome.APPLIED
    assert not mark.exists()
    assert rig.adapter.node_facts(node).reason == evil


# -- fault injection ----------------------------------------------------------------------


def test_ssh_dropped_mid_drain_is_retried_and_drains_exactly_once(
    lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path
) -> None:
    node = "gpu-node-009"
    sent_before = lab.update_rpc_count(node)
    # The proxy cuts the connection as soon as the drain took effect, before the reply arrives.
    with FaultProxy(lab.ssh_port, trigger=lambda: drained(lab, node), fault=Fault.CUT) as proxy:
        settings = proxied(ssh_settings, lab, proxy, tmp_path)
        with rig_for(lab, settings, tmp_path) as rig:
            report = rig.execute(rig.plan(xid79(node)))
    assert proxy.fired.is_set()
    [outcome] = report.nodes
    assert outcome.outcome is Outcome.APPLIED and "connection dropped" in outcome.message
    assert "not sent again" in outcome.message
    assert drained(lab, node) and lab.update_rpc_count(node) - sent_before == 1


def test_flapping_connection_is_retried_with_backoff(lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path) -> None:
    node = "gpu-node-012"
    with FaultProxy(lab.ssh_port, refuse_first=2) as proxy:
        settings = proxied(ssh_settings, lab, proxy, tmp_path)
        with rig_for(lab, settings, tmp_path) as rig:
            report = rig.execute(rig.plan(xid79(node)))
    assert proxy.accepted >= 3
    assert report.nodes[0].outcome is Outcome.APPLIED and drained(lab, node)


def test_losing_the_cluster_mid_run_says_what_was_already_done(
    lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path
) -> None:
    first, second = "gpu-node-004", "gpu-node-005"
    with rig_for(lab, ssh_settings, tmp_path / "setup") as setup:
        plan = setup.plan(xid79_on([first, second]),
                          policy=IsolationPolicy(limits=SafetyLimits(max_isolated_fraction=0.5)))
    with FaultProxy(lab.ssh_port) as proxy:
        settings = proxied(ssh_settings, lab, proxy, tmp_path)

        def wrap(runner: CommandRunner) -> CommandRunner:
            # Once the first drain took effect, the controller becomes unreachable for good.
            return Hooked(runner, lambda argv: drained(lab, first), lambda: proxy.__exit__(None, None, None))

        with rig_for(lab, settings, tmp_path, wrap=wrap) as rig:
            with pytest.raises(TransientRemoteError) as caught:
                rig.execute(plan)
    message = str(caught.value)
    assert (f"before this error: no node was changed; drain {first} was sent or about to be (the next run "
            "settles it from the node's state); not reached: gpu-node-005. Every step is in the audit log "
            f"{rig.audit.path}") in message
    assert drained(lab, first) and not drained(lab, second)
    assert (rig.store / "audit" / INCIDENT / "audit.jsonl").read_bytes() == rig.audit.path.read_bytes()


def _settings_file(path: Path, settings: SshSettings, folder: Path, runbook: Path | None = None) -> Path:
    path.write_text(yaml.safe_dump({
        "ssh": {"host": settings.host, "port": settings.port, "key_path": str(settings.key_path),
                "known_hosts": str(settings.known_hosts), "command_timeout_s": 120,
                "backoff": {"attempts": 2, "initial_s": 0.05}},
        "state_dir": str(folder),
        "trusted_approvers": str(APPROVERS_FILE),
        "evidence_store": str(folder / "store"),
        "verify_timeout_s": 10,
        **({"runbook": str(runbook)} if runbook else {}),
    }))
    return path


def test_crash_between_intent_and_result_recovers_by_reading_state(
    lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path
) -> None:
    node = "gpu-node-013"
    sent_before = lab.update_rpc_count(node)
    plan_path = tmp_path / "plan.json"
    with rig_for(lab, ssh_settings, tmp_path) as rig:
        save_plan(rig.plan(xid79(node)), plan_path)
    assert CliRunner().invoke(app, ["approve", str(plan_path), "--approver", "alice", "--key", key_file("alice")]).exit_code == 0
    audit_path = tmp_path / "audit.jsonl"

    # A real `denpex isolate --execute` process. Once the drain took effect the proxy swallows
    # the reply, so the process hangs between intent and result; then it is killed (SIGKILL).
    with FaultProxy(lab.ssh_port, trigger=lambda: drained(lab, node), fault=Fault.STALL) as proxy:
        config = _settings_file(tmp_path / "via-proxy.yaml", proxied(ssh_settings, lab, proxy, tmp_path), tmp_path)
        child = subprocess.Popen(
            [sys.executable, "-m", "denpex", "isolate", str(plan_path), "--execute", "--config", str(config)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path,
        )
        try:
            deadline = time.monotonic() + 60
            while not (proxy.fired.is_set() and audit_path.exists() and "intent" in audit_path.read_text()):
                assert child.poll() is None, child.stdout.read().decode() if child.stdout else ""
                assert time.monotonic() < deadline, "the drain never reached the node"
                time.sleep(0.05)
            time.sleep(0.3)
            child.send_signal(signals.SIGKILL)
        finally:
            child.kill()
            child.wait(timeout=10)
            if child.stdout:
                child.stdout.close()
    [intent] = AuditLog(audit_path).records()
    assert intent.kind is AuditKind.INTENT and drained(lab, node)

    direct = _settings_file(tmp_path / "direct.yaml", ssh_settings, tmp_path)
    result = CliRunner().invoke(app, ["isolate", str(plan_path), "--execute", "--config", str(direct)])
    assert result.exit_code == 0, result.output
    assert "took effect; nothing was repeated blindly" in result.stdout
    assert lab.update_rpc_count(node) - sent_before == 1
    records = AuditLog(audit_path).records()
    assert [(r.kind, r.outcome) for r in records] == [
        (AuditKind.INTENT, None),
        (AuditKind.RESULT, Outcome.RECOVERED_APPLIED),
        (AuditKind.SKIP, Outcome.ALREADY_DONE),
    ]
    assert records[1].intent_seq == intent.seq and verify_audit_log(audit_path).ok


def test_intent_never_sent_is_resolved_from_state_then_sent_once(rig: Rig) -> None:
    node = "gpu-node-014"
    sent_before = rig.lab.update_rpc_count(node)
    plan = rig.plan(xid79(node))
    approval = signed(plan, "alice")
    # The earlier run died right after writing its intent, before sending anything.
    rig.audit.append(AuditEntry(
        kind=AuditKind.INTENT, incident_id=INCIDENT, plan_hash=plan.content_hash(),
        operation=Operation.ISOLATE, approver="alice", node=node, action="drain",
        command=rig.adapter.command_for(plan.actions[0], Operation.ISOLATE),
    ), at=utc_now())
    report = rig.execute(plan, approval=approval)
    assert "did not take effect" in report.recovered[0]
    assert report.nodes[0].outcome is Outcome.APPLIED
    assert rig.lab.update_rpc_count(node) - sent_before == 1
    outcomes = [(r.kind, r.outcome, r.intent_seq) for r in rig.audit.records()]
    assert outcomes == [
        (AuditKind.INTENT, None, None),
        (AuditKind.RESULT, Outcome.RECOVERED_NOT_APPLIED, 1),
        (AuditKind.INTENT, None, None),
        (AuditKind.RESULT, Outcome.APPLIED, 3),
    ]


def test_an_isolation_cut_short_is_settled_before_its_rollback(rig: Rig) -> None:
    node = "gpu-node-014"
    plan = rig.plan(xid79(node))
    # An earlier `isolate` wrote its intent, its drain went through, and the process died.
    rig.audit.append(AuditEntry(
        kind=AuditKind.INTENT, incident_id=INCIDENT, plan_hash=plan.content_hash(),
        operation=Operation.ISOLATE, approver="alice", node=node, action="drain",
        command=rig.adapter.command_for(plan.actions[0], Operation.ISOLATE),
    ), at=utc_now())
    rig.lab.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={plan.actions[0].reason}"])

    back = rig.execute(plan, operation=Operation.ROLLBACK)
    assert len(back.recovered) == 1 and "so the isolate took effect" in back.recovered[0]
    assert back.nodes[0].outcome is Outcome.APPLIED and not drained(rig.lab, node)
    assert [(r.kind, r.operation, r.outcome, r.intent_seq) for r in rig.audit.records()] == [
        (AuditKind.INTENT, Operation.ISOLATE, None, None),
        (AuditKind.RESULT, Operation.ISOLATE, Outcome.RECOVERED_APPLIED, 1),
        (AuditKind.INTENT, Operation.ROLLBACK, None, None),
        (AuditKind.RESULT, Operation.ROLLBACK, Outcome.APPLIED, 3),
    ]


@pytest.mark.parametrize("case", ["changed-host-key", "unknown-host", "key-not-authorized"])
def test_wrong_keys_are_refused_before_anything_is_sent(
    lab: SlurmLab, ssh_settings: SshSettings, tmp_path: Path, case: str
) -> None:
    node = "gpu-node-015"
    sent_before = lab.update_rpc_count(node)
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    known = tmp_path / "known_hosts"
    with FaultProxy(lab.ssh_port) as proxy:
        settings = proxied(ssh_settings, lab, proxy, tmp_path)
        if case == "changed-host-key":
            known.write_text(f"[127.0.0.1]:{proxy.port} ssh-ed25519 {(other.with_suffix('.pub')).read_text().split()[1]}\n")
            settings = settings.model_copy(update={"known_hosts": known})
            expected, needle = HostKeyError, "does not match known_hosts"
        elif case == "unknown-host":
            known.write_text("")
            settings = settings.model_copy(update={"known_hosts": known})
            expected, needle = HostKeyError, "is not in known_hosts"
        else:
            settings = settings.model_copy(update={"key_path": other})
            expected, needle = RemoteAuthError, "refused our key"
        plan = plan_isolation(xid79(node), None, IsolationPolicy(), None, Scheduler.SLURM, INCIDENT, utc_now(),
                              cluster="lab")
        with rig_for(lab, settings, tmp_path) as rig:
            with pytest.raises(expected, match=needle) as caught:
                rig.execute(plan)
            assert "nothing was sent" in str(caught.value) or case == "key-not-authorized"
            assert not rig.audit.path.exists()
    assert proxy.accepted == 1  # never retried
    assert not drained(lab, node) and lab.update_rpc_count(node) == sent_before


# -- the CLI, end to end ------------------------------------------------------------------


def test_cli_approve_isolate_verify_rollback(rig: Rig, ssh_settings: SshSettings, tmp_path: Path) -> None:
    node = "gpu-node-010"
    plan_path = tmp_path / "plan.json"
    save_plan(rig.plan(xid79(node)), plan_path)
    config = _settings_file(tmp_path / "cli.yaml", ssh_settings, tmp_path / "cli")
    runner = CliRunner()

    dry = runner.invoke(app, ["isolate", str(plan_path), "--dry-run", "--config", str(config)])
    assert dry.exit_code == 0 and "WOULD run: scontrol update NodeName=gpu-node-010 State=DRAIN" in dry.stdout
    unapproved = runner.invoke(app, ["isolate", str(plan_path), "--execute", "--config", str(config)])
    assert unapproved.exit_code == 2 and "cannot read approval" in unapproved.stderr
    assert not drained(rig.lab, node)

    approved = runner.invoke(app, ["approve", str(plan_path), "--approver", "alice", "--key", key_file("alice"), "--cluster", "lab"])
    assert approved.exit_code == 0 and (tmp_path / "plan.approval.json").exists()
    assert "on cluster lab as alice" in approved.stdout
    done = runner.invoke(app, ["isolate", str(plan_path), "--execute", "--config", str(config), "--format", "json"])
    assert done.exit_code == 0, done.output
    assert '"outcome": "applied"' in done.stdout and drained(rig.lab, node)
    verified = runner.invoke(app, ["audit", "verify", str(tmp_path / "cli" / "audit.jsonl")])
    assert verified.exit_code == 0 and "2 records, chain intact" in verified.stdout

    # The isolate approval does not cover undoing it: a rollback is approved on its own.
    refused = runner.invoke(app, ["isolate", str(plan_path), "--execute", "--rollback", "--config", str(config)])
    assert refused.exit_code == 2 and "is for isolate, not rollback" in refused.stderr
    assert "`denpex approve PLAN --approver NAME --key KEYFILE --operation rollback`" in refused.stderr
    assert drained(rig.lab, node)
    approved = runner.invoke(app, ["approve", str(plan_path), "--approver", "bob", "--key", key_file("bob"), "--operation", "rollback"])
    assert approved.exit_code == 0 and "approved rollback of plan" in approved.stdout
    back = runner.invoke(app, ["isolate", str(plan_path), "--execute", "--rollback", "--config", str(config)])
    assert back.exit_code == 0 and "DID run: scontrol update NodeName=gpu-node-010 State=RESUME" in back.stdout
    assert "approved by bob" in back.stdout and not drained(rig.lab, node)

    env = {"DENPEX_SSH_KNOWN_HOSTS": str(tmp_path / "empty_known_hosts")}
    (tmp_path / "empty_known_hosts").write_text("")
    refused = runner.invoke(app, ["isolate", str(plan_path), "--dry-run", "--config", str(config)], env=env)
    assert refused.exit_code == 3 and "is not in known_hosts; nothing was sent" in refused.stderr


def test_cli_exit_status_says_whether_every_planned_node_is_isolated(
    rig: Rig, ssh_settings: SshSettings, tmp_path: Path
) -> None:
    ours, theirs = "gpu-node-011", "gpu-node-012"
    plan_path = tmp_path / "plan.json"
    roomy = IsolationPolicy(limits=SafetyLimits(max_isolated_fraction=0.5))
    save_plan(rig.plan(xid79_on([ours, theirs]), policy=roomy, live_facts=False), plan_path)
    config = _settings_file(tmp_path / "cli.yaml", ssh_settings, tmp_path / "cli",
                            runbook=write_runbook(tmp_path / "runbook.yaml", roomy))
    runner = CliRunner()
    assert runner.invoke(app, ["approve", str(plan_path), "--approver", "alice", "--key", key_file("alice")]).exit_code == 0
    rig.lab.run(["scontrol", "update", f"NodeName={theirs}", "State=DRAIN", "Reason=bad DIMM"])

    dry = runner.invoke(app, ["isolate", str(plan_path), "--dry-run", "--config", str(config)])
    assert dry.exit_code == 4, dry.output
    assert f"would not isolate every planned node: {theirs} blocked" in dry.stderr
    done = runner.invoke(app, ["isolate", str(plan_path), "--execute", "--config", str(config)])
    assert done.exit_code == 4, done.output
    assert f"{ours}: act -> applied" in done.stdout and f"{theirs}: blocked -> blocked" in done.stdout
    assert f"did not isolate every planned node: {theirs} blocked" in done.stderr
    assert drained(rig.lab, ours) and reason_of(rig.lab, theirs).startswith("bad DIMM")

    # Their drain ends; the second run isolates what is left and reports success.
    rig.lab.run(["scontrol", "update", f"NodeName={theirs}", "State=RESUME"])
    again = runner.invoke(app, ["isolate", str(plan_path), "--execute", "--config", str(config)])
    assert again.exit_code == 0, again.output
    assert again.stderr == "" and drained(rig.lab, ours) and drained(rig.lab, theirs)

    # A plan whose gates blocked every node isolates nothing: never exit 0.
    empty_path = tmp_path / "empty.json"
    save_plan(rig.plan(killed_process(host="gpu-node-013", as_of=utc_now()), policy=roomy), empty_path)
    assert runner.invoke(app, ["approve", str(empty_path), "--approver", "alice", "--key", key_file("alice")]).exit_code == 0
    for mode in ("--dry-run", "--execute"):
        nothing = runner.invoke(app, ["isolate", str(empty_path), mode, "--config", str(config)])
        assert nothing.exit_code == 4, nothing.output
        assert "the plan isolates no node: rank 1 stopped reporting" in nothing.stderr


def test_cli_from_dumps_and_kernel_log_to_a_verified_drain(lab: SlurmLab, ssh_settings: SshSettings,
                                                           tmp_path: Path) -> None:
    """The whole chain a person runs: triage (with telemetry) -> plan -> approve -> execute -> verify."""
    from dumps import dump, history, write

    node = "gpu-node-008"
    now_ns = time.time_ns()
    hosts = {0: "gpu-node-001", 1: node, 2: "gpu-node-003", 3: "gpu-node-004"}
    dumps_dir = write(tmp_path / "dumps", {r: dump(history("0", 5, pending=1, t=now_ns)) for r in (0, 2, 3)},
                      manifest={"job_id": "job-7", "world_size": 4,
                                "ranks": {str(r): {"host": h, "gpu_pci_bus_id": "0000:3b:00.0", "pid": 4240 + r}
                                          for r, h in hosts.items()},
                                "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}})
    xid_time = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(now_ns / 1e9 - 30))
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text(f"{xid_time} {node} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4241, "
                          "GPU has fallen off the bus.\n")
    plan_path = tmp_path / "plan.json"
    config = _settings_file(tmp_path / "cli.yaml", ssh_settings, tmp_path / "state")
    runner = CliRunner()

    triaged = runner.invoke(app, ["triage", str(dumps_dir), "--telemetry", str(kernel_log), "--scheduler", "slurm",
                                  "--cluster", "lab",
                                  "--plan-out", str(plan_path), "--format", "json"])
    assert triaged.exit_code == 0, triaged.output
    assert json.loads(triaged.stdout)["plan"]["actions"] == [{"node": node, "action": "drain"}]
    assert runner.invoke(app, ["approve", str(plan_path), "--approver", "alice", "--key", key_file("alice")]).exit_code == 0
    done = runner.invoke(app, ["isolate", str(plan_path), "--execute", "--config", str(config)])
    assert done.exit_code == 0, done.output
    assert "gpu-node-008: act -> applied" in done.stdout
    assert drained_nodes(lab) == {node}
    assert runner.invoke(app, ["audit", "verify", str(tmp_path / "state" / "audit.jsonl")]).exit_code == 0
