"""A served deployment whose trigger is the ARCHITECTURE.md alert event, for the ingest tests.

    python tests/ingest/probe_flow.py NAME     (PREFECT_API_URL set)

Its trigger is the incident flow's own (``flows.serve.alert_trigger``) and its parameters are the
incident flow's; it returns them instead of triaging, so that many alerts are checked quickly.
``test_incident_flow.py`` starts the real incident flow's ``on-alert`` deployment.
"""

from __future__ import annotations

import sys

from prefect import flow, serve

from flows.serve import alert_trigger


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
