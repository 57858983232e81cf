"""Starting the incident flow: the alert event of docs/contracts.md, behind one small interface.

The event is ``denpex.ingest.alert_event``'s, the one definition the flow's trigger, the
``denpex`` commands and this service share (event ``denpex.alert.nccl-timeout``, id
uuid5(tenant/cluster/alert_id) so that Prefect drops a re-sent event, resource
``denpex.alert.{alert_id}``, payload = the flow's parameters). The core never imports Prefect:
:class:`PrefectEventTrigger` posts it to Prefect's HTTP API (``POST {PREFECT_API_URL}/events``) and
finds the run the trigger made from it by its ``alert_id`` parameter
(``POST {PREFECT_API_URL}/flow_runs/filter``). :class:`RecordingTrigger` is the
in-memory fake; :class:`NoEngineTrigger` refuses alerts (503) when no engine is configured.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
from pydantic import BaseModel

from denpex.ingest.alert_event import ALERT_EVENT, AlertEvent, AlertEventError, api_headers, emit_alert
from denpex.ingest.errors import StoreUnavailableError

__all__ = ["ALERT_EVENT", "AlertEvent", "FlowRunView", "FlowTrigger", "PrefectEventTrigger", "RecordingTrigger",
           "NoEngineTrigger"]


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

    def __init__(self, api_url: str, *, timeout_s: float = 10.0, auth_string: str | None = None) -> None:
        self.api_url = api_url.rstrip("/")
        self._timeout_s = timeout_s
        self._auth_string = auth_string  # "user:password" for an API behind basic authentication
        self._http: httpx.Client | None = None
        self._http_lock = threading.Lock()

    def _client(self) -> httpx.Client:
        """One client for the trigger's lifetime (a new one per lookup built an SSL context each time,
        66 ms of CPU, on every incident view); thread-safe, as the service's handlers share it."""
        with self._http_lock:
            if self._http is None:
                self._http = httpx.Client(timeout=self._timeout_s, headers=api_headers(self._auth_string))
            return self._http

    def start(self, event: AlertEvent) -> None:
        try:
            emit_alert(self.api_url, event, occurred=datetime.now(UTC), timeout_s=self._timeout_s,
                       auth_string=self._auth_string)
        except AlertEventError as exc:
            raise StoreUnavailableError(f"the flow engine did not take the alert ({exc}); the alert was not "
                                        "accepted, retry") from exc

    def find_run(self, alert_id: str) -> FlowRunView | None:
        # The flow-run filter cannot match on parameters, so the newest runs are read and matched
        # here; an incident's run is among the newest while anyone asks about it.
        try:
            response = self._client().post(f"{self.api_url}/flow_runs/filter",
                                           json={"sort": "EXPECTED_START_TIME_DESC", "limit": 200})
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
