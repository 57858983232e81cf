"""The note an isolation's report carries about the hung job, derived from the nodes' facts.

A drain waits for the jobs on the node, and a hung job never ends; that is worth saying only when
the job still runs on a node the run isolated::

    job 1234, nodes [gpu-node-002 MIXED+DRAIN running ("1234",)]
    -> "job 1234 still runs on gpu-node-002 (MIXED+DRAIN) and, hung, never ends: ..."
    job 1234, nodes [gpu-node-002 IDLE+DRAIN running ()]  -> no note

Worded for the Prefect UI's operator: restarting the job elsewhere is the operation ``requeue``,
approved on its own through the same pause and form (the ``requeue-hung-job`` deployment), not a
command-line flag.
"""

from __future__ import annotations

from collections.abc import Sequence

from denpex.isolation.plan import HungJob
from denpex.isolation.policy import Scheduler

__all__ = ["hung_job_notes", "runs_the_job", "REQUEUE_DEPLOYMENT"]

# The deployment that asks for the requeue's approval (flows/requeue.py serves it under this name).
REQUEUE_DEPLOYMENT = "requeue-hung-job"


def runs_the_job(job: HungJob, running: Sequence[str], scheduler: Scheduler) -> bool:
    """True when ``running`` (a node's running jobs) holds the hung job: a Slurm job id exactly, or
    on Kubernetes a ``namespace/pod`` whose pod is named after the job (``<job>-<suffix>``, as a
    Job's controller names its pods)."""
    if scheduler is Scheduler.SLURM:
        return job.job_id in running
    return any(name.rpartition("/")[2].startswith(f"{job.job_id}-") for name in running)


def hung_job_notes(job: HungJob | None, nodes: Sequence[tuple[str, str, Sequence[str]]], *,
                   scheduler: Scheduler, plan_hash: str, incident_id: str) -> list[str]:
    """One note when the hung job still runs on any of ``nodes`` ((name, state, running jobs) after
    the run), else none."""
    if job is None:
        return []
    still = [(name, state) for name, state, running in nodes
             if name in job.exclude_nodes and runs_the_job(job, running, scheduler)]
    if not still:
        return []
    where = ", ".join(f"{name} ({state})" if state else name for name, state in still)
    names = ", ".join(name for name, _ in still)
    wait = ("a drain waits for it, so the node stays draining and training stays down"
            if scheduler is Scheduler.SLURM else "its pods keep the cordoned node busy and training stays down")
    return [f"job {job.job_id} still runs on {where} and, hung, never ends: {wait}. Restarting it without "
            f"{names} is a separate operation, requeue, which needs a separate approval of plan "
            f"{plan_hash[:12]}: start the {REQUEUE_DEPLOYMENT} deployment for incident {incident_id} in the "
            "Prefect UI; it pauses for that approval with the same form as the isolation."]
