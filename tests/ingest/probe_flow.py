"""A served deployment whose trigger is the ARCHITECTURE.md alert event, for the ingest tests.

    python tests/ingest/probe_flow.py NAME     (PREFECT_API_URL set)

Until the incident flow of issue 10 exists on this branch, this is the flow an alert starts: its
parameters are exactly the incident flow's, templated one to one from the event's payload, and it
returns them. It runs on the real Prefect engine through ``serve`` (runs in subprocesses).
"""

from __future__ import annotations

import sys

from prefect import flow, serve
from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

PARAMETERS = ("tenant", "cluster", "job_id", "incident_id", "alert_time", "evidence", "world_size",
              "reported_by_rank", "alert_id")


@flow(name="denpex-incident-probe")
def incident_probe(tenant: str, cluster: str, job_id: str, incident_id: str, alert_time: str, evidence: str,
                   alert_id: str, world_size: int | None = None, reported_by_rank: int | None = None) -> dict:
    return {"tenant": tenant, "cluster": cluster, "job_id": job_id, "incident_id": incident_id,
            "alert_time": alert_time, "evidence": evidence, "alert_id": alert_id, "world_size": world_size,
            "reported_by_rank": reported_by_rank}


def main(name: str) -> None:
    trigger = DeploymentEventTrigger(
        expect={"denpex.alert.nccl-timeout"},
        # A single-expression template keeps the payload value's type (int, None) in Prefect 3.
        parameters={p: f"{{{{ event.payload.{p} }}}}" for p in PARAMETERS},
    )
    serve(incident_probe.to_deployment(name=name, triggers=[trigger]), limit=4)


if __name__ == "__main__":
    main(sys.argv[1])
