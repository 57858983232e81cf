"""Requeue the hung job: restart it away from the incident's isolated nodes, approved the same way.

A drain waits for the jobs on a node and a hung job never ends, so an isolation's report says when
the job still runs there; restarting it (Slurm: requeue with ``ExcNodeList``; Kubernetes: delete
its pods on those nodes) is its own operation, ``requeue``, approved in this run's own form.
"""

# No `from __future__ import annotations`: see flows/triage.py.

from typing import Any

from prefect import flow

from denpex.isolation.hung_job_note import REQUEUE_DEPLOYMENT
from denpex.isolation.plan import IsolationPlan, Operation
from denpex.markdown_text import inline
from flows.follow_up import approve_then_run
from tasks.options import NOT_PERSISTED

__all__ = ["requeue_hung_job", "REQUEUE_DEPLOYMENT"]


@flow(name="denpex-requeue-hung-job", **NOT_PERSISTED)
def requeue_hung_job(cluster: str, incident_id: str) -> dict[str, Any]:
    """Pause for approval of the requeue, then restart the hung job without the isolated nodes."""

    def describe(plan: IsolationPlan) -> str:
        job = plan.hung_job
        what = (f"Restart job **{inline(job.job_id)}** without **{inline(', '.join(job.exclude_nodes))}**"
                if job else "The plan offers no hung-job action (no job id, or no node isolated): nothing to do")
        return (f"# Requeue the hung job: incident {inline(incident_id)} on {inline(cluster)}\n\n{what}.\n\n"
                f"Plan hash `{plan.content_hash()}`\n")

    return approve_then_run(cluster, incident_id, Operation.REQUEUE, describe)
