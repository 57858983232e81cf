"""Starting the incident flow: the alert event of ARCHITECTURE.md, behind one small interface.

The ingest service, the ``denpex`` commands and the tests start the flow the same way: a Prefect
event ``denpex.alert.nccl-timeout`` whose payload is exactly the flow's parameters. The core never
imports Prefect; :class:`PrefectEventTrigger` speaks Prefect's HTTP API with httpx::

    POST {PREFECT_API_URL}/events   [{"id", "occurred", "event", "resource", "payload"}]

and finds the run a trigger made from it by its ``alert_id`` parameter
(``POST {PREFECT_API_URL}/flow_runs/filter``). :class:`RecordingTrigger` is the in-memory fake.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
from pydantic import BaseModel, ConfigDict

from denpex.ingest.errors import StoreUnavailableError

__all__ = ["ALERT_EVENT", "AlertEvent", "FlowRunView", "FlowTrigger", "PrefectEventTrigger", "RecordingTrigger",
           "NoEngineTrigger"]

ALERT_EVENT = "denpex.alert.nccl-timeout"
# A fixed namespace, so that one alert id always gives one event id.
_EVENT_NAMESPACE = uuid.UUID("6f1c9a52-3b7e-4f0e-9d55-2f8d9c1e4a10")


class AlertEvent(BaseModel):
    """The event's payload: exactly the incident flow's parameters; ``alert_id`` is the idempotency key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenant: str
    cluster: str
    job_id: str
    incident_id: str
    alert_time: str
    evidence: str
    world_size: int | None = None
    reported_by_rank: int | None = None
    alert_id: str


class FlowRunView(BaseModel):
    """The flow run started for an incident, as the incident endpoint shows it."""

    flow_run_id: str
    name: str | None = None
    state: str | None = None


class FlowTrigger(Protocol):
    """Starts the incident flow for one alert, and finds its run again."""

    def start(self, event: AlertEvent) -> None:
        """Emit the alert event; raise StoreUnavailableError when the engine cannot be reached."""
        ...

    def find_run(self, alert_id: str) -> FlowRunView | None:
        """The run started for ``alert_id``, or None (not yet, or the engine is unreachable)."""
        ...


class PrefectEventTrigger:
    """Emits the alert event through Prefect's HTTP API (no Prefect import)."""

    def __init__(self, api_url: str, *, timeout_s: float = 10.0, api_key: str | None = None) -> None:
        self.api_url = api_url.rstrip("/")
        self._timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def start(self, event: AlertEvent) -> None:
        body = [{
            "id": str(uuid.uuid5(_EVENT_NAMESPACE, event.alert_id)),
            "occurred": datetime.now(UTC).isoformat(),
            "event": ALERT_EVENT,
            "resource": {"prefect.resource.id": f"denpex.incident.{event.tenant}.{event.cluster}.{event.incident_id}",
                         "prefect.resource.name": event.incident_id},
            "payload": event.model_dump(mode="json"),
        }]
        try:
            response = httpx.post(f"{self.api_url}/events", json=body, headers=self._headers,
                                  timeout=self._timeout_s)
        except httpx.HTTPError as exc:
            raise StoreUnavailableError(f"the flow engine at {self.api_url} cannot be reached ({exc}); "
                                        "the alert was not accepted, retry") from exc
        if response.status_code >= 300:
            raise StoreUnavailableError(f"the flow engine refused the alert event (HTTP {response.status_code}: "
                                        f"{response.text[:200]}); the alert was not accepted, retry")

    def find_run(self, alert_id: str) -> FlowRunView | None:
        # The flow-run filter cannot match on parameters, so the newest runs are read and matched
        # here; an incident's run is among the newest while anyone asks about it.
        try:
            response = httpx.post(f"{self.api_url}/flow_runs/filter", headers=self._headers,
                                  json={"sort": "EXPECTED_START_TIME_DESC", "limit": 200},
                                  timeout=self._timeout_s)
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        for run in response.json():
            if _parameters(run).get("alert_id") == alert_id:
                state = run.get("state") or {}
                return FlowRunView(flow_run_id=str(run.get("id")), name=run.get("name"),
                                   state=state.get("type") if isinstance(state, dict) else None)
        return None


class NoEngineTrigger:
    """No flow engine configured: alerts are refused with 503 (and retried by the sender)."""

    def start(self, event: AlertEvent) -> None:
        raise StoreUnavailableError("no flow engine is configured (set PREFECT_API_URL for `denpex serve-api`); "
                                    "the alert was not accepted")

    def find_run(self, alert_id: str) -> FlowRunView | None:
        return None


class RecordingTrigger:
    """In-memory fake for unit tests: records every event it was asked to emit."""

    def __init__(self) -> None:
        self.events: list[AlertEvent] = []

    def start(self, event: AlertEvent) -> None:
        self.events.append(event)

    def find_run(self, alert_id: str) -> FlowRunView | None:
        started = [e for e in self.events if e.alert_id == alert_id]
        return FlowRunView(flow_run_id=f"recorded-{alert_id}", state="SCHEDULED") if started else None


def _parameters(run: Any) -> dict[str, Any]:
    params = run.get("parameters") if isinstance(run, dict) else None
    return params if isinstance(params, dict) else {}
