"""Issue 8 item 9 on the real Slurm lab: the hung job is requeued away from the drained node, as
its own approved, audited and verified action."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from denpex.cli import app
from denpex.isolation.audit import AuditKind, Outcome
from denpex.isolation.errors import ApprovalError
from denpex.isolation.run.report import NodeDecision
from denpex.isolation.plan import Operation, save_plan
from denpex.isolation.slurm_parse import parse_show_job
from denpex.isolation.ssh import CommandRunner, SshSettings
from isolation.trust import signed
from lab.rig import Hooked, Rig, drained, rig_for, xid79
from lab.test_isolation_trust import settings_file
from testkit.services.slurm import SlurmLab

pytestmark = pytest.mark.slow


def submit_anywhere(lab: SlurmLab) -> tuple[str, str]:
    """A job that Slurm places (no --nodelist, as training jobs are); its id and node once RUNNING."""
    out = lab.run(["sbatch", "--parsable", "--ntasks=1", f"--output={lab.root / 'jobs' / 'slurm-%j.out'}",
                   "--wrap=sleep 600"]).stdout.strip()
    job = out.split(";")[0]
    deadline = time.monotonic() + 120  # a job may wait for slurmctld's next scheduling pass
    while time.monotonic() < deadline:
        state, _, node = lab.run(["squeue", "-h", "-j", job, "-o", "%T %N"]).stdout.strip().partition(" ")
        if state == "RUNNING":
            return job, node
        time.sleep(0.1)
    raise AssertionError(f"job {job} never ran")


def test_the_hung_job_is_requeued_with_the_drained_node_excluded(rig: Rig) -> None:
    job, node = submit_anywhere(rig.lab)
    plan = rig.plan(xid79(node), job_id=job)
    assert plan.hung_job is not None and plan.hung_job.exclude_nodes == (node,)
    assert "DRAIN of" in plan.hung_job.message and "waits forever" in plan.hung_job.message

    isolated = rig.execute(plan)
    assert isolated.nodes[0].outcome is Outcome.APPLIED and any(f"job {job} still runs on {node}" in n for n in isolated.notes)
    assert rig.lab.state_of(node) in ("MIXED+DRAIN", "ALLOCATED+DRAIN")  # draining, forever
    # Approving the drain did not approve restarting the job.
    with pytest.raises(ApprovalError, match="is for isolate, not requeue"):
        rig.execute(plan, operation=Operation.REQUEUE, approval=signed(plan))

    report = rig.execute(plan, operation=Operation.REQUEUE)
    [outcome] = report.nodes
    assert outcome.outcome is Outcome.APPLIED, outcome.message
    assert outcome.command == (f"scontrol requeuehold {job}; scontrol update JobId={job} ExcNodeList={node}; "
                               f"scontrol release {job}")
    shown = parse_show_job(rig.lab.run(["scontrol", "-o", "show", "job", job]).stdout)
    assert shown is not None and node in shown.excluded and node not in shown.active_on and not shown.held
    deadline = time.monotonic() + 60
    while rig.lab.state_of(node) != "IDLE+DRAIN" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rig.lab.state_of(node) == "IDLE+DRAIN" and drained(rig.lab, node)  # drained, not draining
    intent, result = [r for r in rig.audit.records() if r.operation is Operation.REQUEUE]
    assert (intent.kind, result.kind, result.outcome) == (AuditKind.INTENT, AuditKind.RESULT, Outcome.APPLIED)
    assert result.intent_seq == intent.seq and result.approver == "alice"

    again = rig.execute(plan, operation=Operation.REQUEUE)
    assert again.nodes[0].decision is NodeDecision.ALREADY_DONE
    assert rig.audit.records()[-1].kind is AuditKind.SKIP


def test_cli_dry_run_says_what_the_requeue_would_send(rig: Rig, ssh_settings: SshSettings, tmp_path: Path) -> None:
    job, node = submit_anywhere(rig.lab)
    plan_path = tmp_path / "plan.json"
    save_plan(rig.plan(xid79(node), job_id=job), plan_path)
    config = settings_file(tmp_path / "s.yaml", ssh_settings, tmp_path / "state")
    dry = CliRunner().invoke(app, ["isolate", str(plan_path), "--dry-run", "--requeue-hung-job", "--config", str(config)])
    assert dry.exit_code == 0, dry.output
    assert f"WOULD run: scontrol requeuehold {job}" in dry.stdout
    assert rig.lab.job_state(job) == "RUNNING"


class Crash(BaseException):
    """The executor's process dying at that instant (a kill, a lost laptop)."""


def test_a_requeue_cut_short_is_settled_from_the_jobs_state_and_finished(lab: SlurmLab, ssh_settings: SshSettings,
                                                                         tmp_path: Path) -> None:
    """A crash between the hold and the release leaves the job held and an intent without a result.
    The next run records what the job's state shows for that intent, then finishes the restart."""
    job, node = submit_anywhere(lab)

    def crash() -> None:
        raise Crash

    def wrap(runner: CommandRunner) -> CommandRunner:
        return Hooked(runner, lambda argv: list(argv[:2]) == ["scontrol", "update"] and "JobId=" in argv[2], crash)

    with rig_for(lab, ssh_settings, tmp_path) as setup:
        plan = setup.plan(xid79(node), job_id=job)
        assert setup.execute(plan).nodes[0].outcome is Outcome.APPLIED
    with rig_for(lab, ssh_settings, tmp_path, wrap=wrap) as crashing, pytest.raises(Crash):
        crashing.execute(plan, operation=Operation.REQUEUE)
    shown = parse_show_job(lab.run(["scontrol", "-o", "show", "job", job]).stdout)
    assert shown is not None and shown.held  # the hold went out, the release never did

    with rig_for(lab, ssh_settings, tmp_path) as rig:
        report = rig.execute(plan, operation=Operation.REQUEUE)
        assert report.nodes[0].outcome is Outcome.APPLIED, report.nodes[0].message
        records = [r for r in rig.audit.records() if r.operation is Operation.REQUEUE]
    intents = [r for r in records if r.kind is AuditKind.INTENT]
    results = {r.intent_seq: r for r in records if r.kind is AuditKind.RESULT}
    assert len(intents) == 2 and all(i.seq in results for i in intents), [(r.kind, r.seq, r.intent_seq) for r in records]
    assert results[intents[0].seq].outcome is Outcome.RECOVERED_NOT_APPLIED
    assert report.recovered and "took effect" not in report.recovered[0].replace("did not take effect", "")
    shown = parse_show_job(lab.run(["scontrol", "-o", "show", "job", job]).stdout)
    assert shown is not None and node in shown.excluded and not shown.held
    # The requeue's records reach the evidence store, like an isolation's.
    assert (tmp_path / "store" / "audit" / "inc-lab" / "audit.jsonl").read_bytes() == rig.audit.path.read_bytes()


def idle_node(lab: SlurmLab) -> str:
    """A node no job runs on (IDLE), for the note that must not appear."""
    busy = set(lab.run(["squeue", "-h", "-t", "RUNNING,COMPLETING", "-o", "%N"]).stdout.split())
    idle = [n for n in lab.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"]).stdout.split() if n not in busy]
    assert idle, "the lab has no idle node"
    return idle[0]


def test_no_never_ends_note_when_the_hung_job_does_not_run_on_the_drained_node(rig: Rig) -> None:
    """Issue 20 item 4: the execution's notes are derived from its facts. The job runs elsewhere,
    so the drained node is IDLE+DRAIN at once and nothing waits for the job."""
    job, busy = submit_anywhere(rig.lab)
    node = idle_node(rig.lab)
    assert node != busy
    plan = rig.plan(xid79(node), job_id=job)
    assert plan.hung_job is not None
    report = rig.execute(plan)
    assert report.nodes[0].outcome is Outcome.APPLIED and not report.nodes[0].running_jobs
    assert report.nodes[0].state_after == "IDLE+DRAIN"
    assert not [n for n in report.notes if "never ends" in n or "waits forever" in n], report.notes


def test_the_never_ends_note_names_the_separate_requeue_approval_not_a_cli_flag(rig: Rig) -> None:
    job, node = submit_anywhere(rig.lab)
    plan = rig.plan(xid79(node), job_id=job)
    report = rig.execute(plan)
    [note] = [n for n in report.notes if "never ends" in n]
    assert f"job {job} still runs on {node}" in note
    assert "requeue" in note and "separate approval" in note and plan.content_hash()[:12] in note
    assert "--" not in note and "`denpex" not in note, note  # no CLI flag: the UI operator reads it too
