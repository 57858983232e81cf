"""A served deployment whose trigger is the ARCHITECTURE.md alert event, for the ingest tests.

    python tests/ingest/probe_flow.py NAME     (PREFECT_API_URL set)

Its trigger is the incident flow's (branch issue-10a, ``flows.serve.alert_trigger``: same event,
same resource match, same parameter mapping) and its parameters are the incident flow's; it
returns them instead of triaging. Once issue-10a is merged, swap in its ``on-alert`` deployment.
"""

from __future__ import annotations

import sys

from prefect import flow, serve
from prefect.events import DeploymentEventTrigger

PARAMETERS = ("tenant", "cluster", "job_id", "incident_id", "alert_time", "evidence", "world_size",
              "reported_by_rank", "alert_id")


def alert_trigger() -> DeploymentEventTrigger:
    """The incident flow's trigger as branch issue-10a declares it (flows/serve.py): one run per event,
    its payload mapped one to one onto the parameters (a single-expression template keeps types)."""
    return DeploymentEventTrigger(
        name="denpex-alert",
        expect={"denpex.alert.nccl-timeout"},
        match={"prefect.resource.id": "denpex.alert.*"},
        parameters={name: f"{{{{ event.payload.{name} }}}}" for name in PARAMETERS},
    )


@flow(name="denpex-incident-probe")
def incident_probe(tenant: str, cluster: str, job_id: str, incident_id: str, alert_time: str, evidence: str,
                   alert_id: str, world_size: int | None = None, reported_by_rank: int | None = None) -> dict:
    return {"tenant": tenant, "cluster": cluster, "job_id": job_id, "incident_id": incident_id,
            "alert_time": alert_time, "evidence": evidence, "alert_id": alert_id, "world_size": world_size,
            "reported_by_rank": reported_by_rank}


def main(name: str) -> None:
    serve(incident_probe.to_deployment(name=name, triggers=[alert_trigger()]), limit=4)


if __name__ == "__main__":
    main(sys.argv[1])
