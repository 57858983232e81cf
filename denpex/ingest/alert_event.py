"""The alert event that starts the incident flow (docs/contracts.md "Alert event").

The event's payload is exactly the flow's parameters; its id is derived from ``alert_id``, so a
re-sent alert is the same event and starts no second run (the server drops an event id it has
seen). It is posted to Prefect's HTTP API, so the core never imports Prefect. The ingest service
emits it (``flow_trigger``) and the served deployments trigger on it (``flows/serve.py``); it lives
in ingest, the lowest layer that uses it::

    AlertEvent(tenant="acme", cluster="lab", ..., alert_id="am-7f3a").event_body(now)
    -> {"id": uuid5(alert_id), "event": "denpex.alert.nccl-timeout", "occurred": ...,
        "resource": {"prefect.resource.id": "denpex.alert.am-7f3a", ...}, "payload": {...}}
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
import uuid
from datetime import datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

__all__ = ["ALERT_EVENT", "AlertEvent", "AlertEventError", "api_headers", "emit_alert"]

ALERT_EVENT = "denpex.alert.nccl-timeout"
_NAMESPACE = uuid.UUID("6f1d2d0e-4a4b-4f3b-9a55-0d3e5d1e7a10")


class AlertEventError(Exception):
    """The Prefect API refused the event or could not be reached."""


class AlertEvent(BaseModel):
    """The incident flow's parameters, as the alert carries them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant: str = Field(min_length=1, max_length=200)
    cluster: str = Field(min_length=1, max_length=200)
    job_id: str = Field(min_length=1, max_length=200)
    incident_id: str = Field(min_length=1, max_length=63)
    alert_time: AwareDatetime
    evidence: str = Field(min_length=1, description="a folder or s3:// URI")
    world_size: int | None = Field(default=None, ge=1)
    reported_by_rank: int | None = Field(default=None, ge=0)
    alert_id: str = Field(min_length=1, max_length=200)

    def event_id(self) -> str:
        return str(uuid.uuid5(_NAMESPACE, f"{self.tenant}/{self.cluster}/{self.alert_id}"))

    def event_body(self, occurred: datetime) -> dict[str, Any]:
        return {
            "id": self.event_id(),
            "event": ALERT_EVENT,
            "occurred": occurred.isoformat(),
            "resource": {"prefect.resource.id": f"denpex.alert.{self.alert_id}",
                         "denpex.tenant": self.tenant, "denpex.cluster": self.cluster},
            "related": [],
            "payload": self.model_dump(mode="json"),
        }


def api_headers(auth_string: str | None) -> dict[str, str]:
    """The headers a self-hosted Prefect API behind basic authentication wants
    (``PREFECT_SERVER_API_AUTH_STRING`` on the server, ``user:password``), as Prefect's own client
    sends them for ``PREFECT_API_AUTH_STRING``; none without one."""
    if not auth_string:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(auth_string.encode()).decode()}


def emit_alert(api_url: str, alert: AlertEvent, *, occurred: datetime, timeout_s: float = 10.0,
               auth_string: str | None = None) -> None:
    """``POST {api_url}/events`` with the one event (basic authentication with ``auth_string``)."""
    body = json.dumps([alert.event_body(occurred)]).encode()
    request = urllib.request.Request(f"{api_url.rstrip('/')}/events", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **api_headers(auth_string)})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (our API URL)
            if response.status >= 300:
                raise AlertEventError(f"the Prefect API answered HTTP {response.status} to the alert event")
    except urllib.error.HTTPError as exc:
        raise AlertEventError(f"the Prefect API answered HTTP {exc.code} to the alert event: "
                              f"{exc.read()[:300]!r}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise AlertEventError(f"the Prefect API at {api_url} could not be reached: {exc}") from exc
