"""Serve the deployments locally with a Prefect runner (no work pool): ``denpex serve``.

The same five deployments as ``prefect.yaml``: triage on the alert event, the nightly replay,
manual triage, return to service, and the requeue of an incident's hung job.

Each flow is handed to the runner as a flow object (``Runner.add_flow``), not as a deployment
to load from storage (what ``prefect.serve`` does): the runner then starts a run from the flow it
holds instead of ``python -m prefect.engine``, which reads the code from storage and imports it
again; and by default the run is forked from a server that already imported everything
(flows/forked_runs.py). The code is therefore the code of when serve started: restart it after
updating Denpex.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from dataclasses import dataclass, field
from typing import Any

from prefect import Flow
from prefect.events import DeploymentEventTrigger
from prefect.exceptions import TerminationSignal
from prefect.runner import Runner

from denpex.ingest.alert_event import ALERT_EVENT
from denpex.workflow.run_settings import SERVED_MARKER
from flows.forked_runs import use_forked_flow_runs
from flows.replay import replay
from flows.requeue import REQUEUE_DEPLOYMENT, requeue_hung_job
from flows.return_to_service import return_to_service
from flows.triage import triage

__all__ = ["ALERT_PARAMETERS", "ServedDeployment", "alert_trigger", "main", "serve", "serve_deployments", "served_deployments"]

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


class _Runner(Runner):
    """Prefect's runner, stopped by SIGTERM as by Ctrl-C: at once.

    Prefect's own SIGTERM handler shuts down "gracefully": it cancels every run in flight and
    gives each up to 30 s to exit, so a run paused for approval held serve for 20 s and more after
    a SIGTERM (the demo's teardown waited on it), and the paused run was marked Cancelled though
    nobody cancelled it. Stopped as by Ctrl-C, the run is left to the signal its process group
    got with serve, as on Ctrl-C.
    """

    def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
        raise TerminationSignal(signal=signal.SIGTERM)


@dataclass(frozen=True)
class ServedDeployment:
    """One deployment: its flow and the options ``Runner.add_flow`` takes (as ``to_deployment`` does)."""

    flow: Flow[..., Any]
    name: str
    options: dict[str, Any] = field(default_factory=dict)


def served_deployments(only: set[str] | None = None) -> list[ServedDeployment]:
    """The deployments, optionally only those named."""
    made = [
        ServedDeployment(triage, "on-alert", {"triggers": [alert_trigger()], "tags": ["denpex", "alert"]}),
        ServedDeployment(triage, "manual", {"tags": ["denpex", "manual"], "enforce_parameter_schema": True}),
        ServedDeployment(return_to_service, "return-to-service", {"tags": ["denpex"], "enforce_parameter_schema": True}),
        ServedDeployment(requeue_hung_job, REQUEUE_DEPLOYMENT, {"tags": ["denpex"], "enforce_parameter_schema": True}),
        ServedDeployment(replay, "nightly-replay", {"cron": "0 3 * * *", "tags": ["denpex", "replay"],
                                                    "parameters": {"catalog": "incidents/catalog.json"}}),
    ]
    return [d for d in made if only is None or d.name in only]


async def serve_deployments(chosen: list[ServedDeployment]) -> None:
    """Serve ``chosen`` with one runner until stopped."""
    # No cap on concurrent runs, as prefect.serve(): a triage run waits in its own process for
    # approval (up to the runbook's timeout), and a cap would leave later alerts Late meanwhile.
    runner = _Runner(pause_on_shutdown=True, limit=None)
    for served in chosen:
        await runner.aadd_flow(served.flow, name=served.name, **served.options)
    names = ", ".join(f"{d.flow.name}/{d.name}" for d in chosen)
    print(f"Serving {names}; polling for runs every {runner.query_seconds:g} s. Ctrl-C stops.", flush=True)
    await runner.start()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="denpex serve", description=__doc__)
    parser.add_argument("--only", action="append", help="serve only this deployment (repeatable)")
    parser.add_argument("--spawn-runs", action="store_true",
                        help="start each run in a fresh interpreter (multiprocessing spawn) instead of "
                             "forking it from a process that already imported the flows (seconds slower)")
    args = parser.parse_args(argv)
    serve(set(args.only) if args.only else None, spawn_runs=args.spawn_runs)


def serve(only: set[str] | None, *, spawn_runs: bool = False) -> None:
    """Serve the chosen deployments (None: all) until Ctrl-C or SIGTERM."""
    # Its runs inherit this (forked or spawned): they were started here, by no job configuration.
    os.environ[SERVED_MARKER] = "1"
    if not spawn_runs:
        use_forked_flow_runs()
    try:
        asyncio.run(serve_deployments(served_deployments(only)))
    except (KeyboardInterrupt, TerminationSignal):
        pass  # stopped as prefect.serve() stops on Ctrl-C or SIGTERM


if __name__ == "__main__":
    main()
