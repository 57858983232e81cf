"""The hung-job note is derived from the nodes' facts after the run (issue 20 item 4)."""

from __future__ import annotations

import pytest

from denpex.isolation.hung_job_note import hung_job_notes
from denpex.isolation.plan import HungJob
from denpex.isolation.policy import Scheduler

JOB = HungJob(job_id="train-7", exclude_nodes=("gpu-node-002",), message="plan's text")


@pytest.mark.parametrize(("scheduler", "running", "noted"), [
    (Scheduler.SLURM, ("train-7",), True),
    (Scheduler.SLURM, (), False),
    (Scheduler.SLURM, ("train-77",), False),
    (Scheduler.KUBERNETES, ("ml/train-7-x2k9p",), True),
    (Scheduler.KUBERNETES, ("ml/train-70-x2k9p", "ml/other"), False),
], ids=["slurm-running", "slurm-idle", "slurm-other-job", "k8s-pod-of-job", "k8s-other-pods"])
def test_the_note_appears_only_while_the_job_runs_on_an_isolated_node(scheduler: Scheduler,
                                                                      running: tuple[str, ...], noted: bool) -> None:
    notes = hung_job_notes(JOB, [("gpu-node-002", "MIXED+DRAIN", running)], scheduler=scheduler, plan_hash="ab" * 32,
                           incident_id="inc-1")
    assert bool(notes) is noted
    if noted:
        assert "gpu-node-002 (MIXED+DRAIN)" in notes[0] and "abababababab" in notes[0] and "--" not in notes[0]
        assert "start the requeue-hung-job deployment for incident inc-1 in the Prefect UI" in notes[0]


def test_no_note_for_a_node_the_job_does_not_exclude_or_without_a_hung_job() -> None:
    assert hung_job_notes(JOB, [("gpu-node-009", "MIXED", ("train-7",))], scheduler=Scheduler.SLURM, plan_hash="0",
                          incident_id="i") == []
    assert hung_job_notes(None, [("gpu-node-002", "MIXED", ("train-7",))], scheduler=Scheduler.SLURM, plan_hash="0",
                          incident_id="i") == []
