"""Serve the deployments locally with ``serve()`` (no work pool): ``denpex serve``.

The same four deployments as ``prefect.yaml``: triage on the alert event, the nightly replay,
manual triage, and return to service. The replay is served once ``flows/replay.py`` exists.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from prefect import serve
from prefect.events import DeploymentEventTrigger

from denpex.workflow.alert_event import ALERT_EVENT
from flows.return_to_service import return_to_service
from flows.triage import triage

__all__ = ["ALERT_PARAMETERS", "alert_trigger", "deployments", "main"]

ALERT_PARAMETERS = ("tenant", "cluster", "job_id", "incident_id", "alert_time", "evidence", "world_size",
                    "reported_by_rank", "alert_id")


def alert_trigger() -> DeploymentEventTrigger:
    """Start one triage run per alert event, its payload mapped one to one onto the parameters."""
    return DeploymentEventTrigger(
        name="denpex-alert",
        expect={ALERT_EVENT},
        match={"prefect.resource.id": "denpex.alert.*"},
        parameters={name: f"{{{{ event.payload.{name} }}}}" for name in ALERT_PARAMETERS},
    )


def deployments(only: set[str] | None = None) -> list[Any]:
    """The runner deployments, optionally only those named."""
    made = [
        triage.to_deployment(name="on-alert", triggers=[alert_trigger()], tags=["denpex", "alert"]),
        triage.to_deployment(name="manual", tags=["denpex", "manual"], enforce_parameter_schema=True),
        return_to_service.to_deployment(name="return-to-service", tags=["denpex"],
                                        enforce_parameter_schema=True),
    ]
    if importlib.util.find_spec("flows.replay") is not None:
        from flows.replay import replay  # Part B's flow; served when present

        made.append(replay.to_deployment(name="nightly-replay", cron="0 3 * * *", tags=["denpex"]))
    return [d for d in made if only is None or getattr(d, "name", None) in only]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="denpex serve", description=__doc__)
    parser.add_argument("--only", action="append", help="serve only this deployment (repeatable)")
    args = parser.parse_args(argv)
    serve(*deployments(set(args.only) if args.only else None))


if __name__ == "__main__":
    main()
