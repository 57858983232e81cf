"""Recovery before action, with real Gloo processes: rank 2 of a real 4-rank job is SIGSTOPped,
the others hang and dump, the run pauses with a plan to drain rank 2's node; the test sends
SIGCONT, the job completes its collective, the HangDumpers dump what they see now (the blocked
ranks again, rank 2 whenever it answers), and the approval that follows withdraws the plan:
nothing is drained."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from conftest import ROOT, local_store
from denpex.analysis.summary import summarize_dump
from denpex.evidence.fr_dump import decode_dump
from denpex.ingest.layout import incident_prefix
from denpex.isolation.audit import AuditKind
from flow_driver import FlowRig, alert, keyed_audit_log, report_of, resume, saved_plan, start_manual, wait_for
from lab.rig import drained_nodes
from testkit.services.rank_zygote import RankProcess, rank_launcher
from testkit.services.slurm import SlurmLab

# Sized to what it starts: the harness server, served flows and the Slurm lab.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

JOB = Path(__file__).with_name("recovery_job.py")
INCIDENT = "inc-recovers"
# The job's collector writes where the ingest service would store the incident in the rig's folder
# store (conftest.local_store): the flow triages no other folder.
EVIDENCE = incident_prefix("acme", "lab", "gloo-recovery", INCIDENT)
STOPPED = 2
STUCK_SEQ = 4  # two all_reduces and a barrier, then the all_reduce that rank 2 is stopped before


def _wait(check: object, what: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def _trigger(evidence: Path, rank: int) -> str | None:
    path = evidence / "collector" / f"rank_{rank}.record.json"
    return json.loads(path.read_text())["trigger"] if path.exists() else None


def _dumps_before(evidence: Path, seq: int) -> dict[int, str]:
    """The ranks whose dump does not show the world group's collective ``seq`` completed, and what
    their dump shows instead. Read with the product's safe decoder (dumps are written atomically)."""
    late = {}
    for rank in range(4):
        path = evidence / f"rank_{rank}.pkl"
        if not path.exists():
            late[rank] = "no dump"
            continue
        group = summarize_dump(decode_dump(path.read_bytes(), source=path.name), rank=rank).groups.get("0")
        if group is None or group.last_completed < seq:
            late[rank] = f"last completed #{group.last_completed if group else None} ({_trigger(evidence, rank)})"
    return late


@pytest.fixture
def job(tmp_path: Path, flow_rig: FlowRig) -> Iterator[tuple[Path, dict[int, RankProcess]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    evidence = local_store(flow_rig) / EVIDENCE
    shutil.rmtree(evidence, ignore_errors=True)  # a rerun in the same session starts clean
    launcher = rank_launcher()  # real processes, forked with torch already imported
    procs = {r: launcher.spawn_script(JOB, ["--rank", str(r), "--work", str(tmp_path), "--evidence", str(evidence)],
                                      env=env, cwd=ROOT, log=tmp_path / f"rank-{r}.log")
             for r in range(4)}
    try:
        yield tmp_path, procs
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.wait(timeout=30)


def _manifest(evidence: Path, procs: dict[int, RankProcess]) -> None:
    ranks = {str(r): {"host": f"gpu-node-{r + 1:03d}", "local_rank": 0, "pid": p.pid,
                      "gpu_pci_bus_id": "0000:3b:00.0"} for r, p in procs.items()}
    (evidence / "manifest.json").write_text(json.dumps({
        "job_id": "gloo-recovery", "world_size": 4, "ranks": ranks,
        "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}}))
    at = (datetime.now(UTC) - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%S")
    (evidence / "kernel.log").write_text(f"{at}+0000 gpu-node-{STOPPED + 1:03d} kernel: NVRM: Xid (PCI:0000:3b:00): "
                                         f"79, pid={procs[STOPPED].pid}, GPU has fallen off the bus.\n")


def test_a_job_that_recovers_while_the_run_is_paused_gets_no_isolation(
        flow_rig: FlowRig, lab: SlurmLab, job: tuple[Path, dict[int, RankProcess]]) -> None:
    work, procs = job
    evidence = local_store(flow_rig) / EVIDENCE
    _wait(lambda: all(_trigger(evidence, r) for r in (0, 1, 3)), "ranks 0, 1 and 3 to dump the hang")
    state = Path(f"/proc/{procs[STOPPED].pid}/status").read_text()
    assert "\nState:\tT" in state, "rank 2 is not stopped"
    assert not (evidence / f"rank_{STOPPED}.pkl").exists(), (
        f"rank 2 dumped before SIGCONT: {_dumps_before(evidence, STUCK_SEQ)} (a false stall before the hang?)")
    _manifest(evidence, procs)

    incident = INCIDENT
    run_id = start_manual(alert(incident, str(evidence), job_id="gloo-recovery", alert_time=datetime.now(UTC)))
    wait_for(run_id, {"PAUSED"})
    plan = saved_plan(flow_rig.state_dir, incident)
    assert [a.node for a in plan.actions] == ["gpu-node-003"]

    os.kill(procs[STOPPED].pid, signal.SIGCONT)
    _wait(lambda: all((work / f"done-{r}").exists() for r in range(4)), "the all_reduce to complete")
    # Approve once the evidence of the recovery exists: every rank's dump shows the all_reduce
    # (#4) completed. Approved before that, the drain would rightly run. Rank 2 answers the
    # pending request on SIGCONT, before, during or after its all_reduce: it dumps again (trigger
    # recovered) in the first two cases, and need not in the third.
    deadline = time.monotonic() + 60
    while (late := _dumps_before(evidence, STUCK_SEQ)) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not late, f"60 s after SIGCONT these dumps still do not show #{STUCK_SEQ} completed: {late}"
    assert all(_trigger(evidence, r) == "recovered" for r in (0, 1, 3)), "a blocked rank's second dump"

    resume(run_id, {"decision": "approve", "plan_hash": plan.content_hash(), "nodes": ["gpu-node-003"],
                    "approver": "alice", "comment": "drain it"}, state_dir=flow_rig.state_dir)
    wait_for(run_id, {"COMPLETED"})
    report = report_of(flow_rig.state_dir, incident, run_id)
    assert report["outcome"] == "withdrawn", report["reason"]
    assert "the job recovered" in report["reason"] and report["execution"] is None
    assert drained_nodes(lab) == set()
    decisions = [r for r in keyed_audit_log(flow_rig.state_dir).records()
                 if r.incident_id == incident]
    # The page's approval, then the withdrawal: the plan was approved, and the recovery undid the need.
    assert [(r.kind, r.action) for r in decisions] == [(AuditKind.DECISION, "approved"),
                                                       (AuditKind.DECISION, "withdrawn")]
