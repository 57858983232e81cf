"""Turning alerts into at most one flow run per incident, and recording ``resolved``.

An alert names its incident (``incident_id``), or joins the job's open incident (the one its
ranks' uploads opened: collectors dump before the watchdog fires), or opens one named after the
job and the alert's start time, which Alertmanager keeps the same on every repeat.
Exactly one delivery per incident emits the alert event (:meth:`IncidentBook.claim_run`); when the
engine cannot take it, the answer is 503 and the next delivery (Alertmanager retries) tries again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from denpex.ingest.alerts import Alert, AlertStatus
from denpex.ingest.errors import ConflictError, IngestError, PayloadTooLargeError, RateLimitedError
from denpex.ingest.flow_trigger import AlertEvent, FlowTrigger
from denpex.ingest.incidents import IncidentBook, IncidentKey, RunState
from denpex.ingest.layout import incident_prefix, join_uri

__all__ = ["AlertLimits", "AlertReceipt", "AlertIntake", "incident_for"]


@dataclass(frozen=True, slots=True)
class AlertLimits:
    """How many alerts one delivery may carry, and how many incident runs a tenant's cluster may
    start per window. One Alertmanager post of a few KB can hold hundreds of alerts, and each new
    incident is a flow run with its own parse workers: without a bound, one request (or one
    misfiring rule) takes the runner from every other tenant."""

    max_alerts_per_request: int = 256
    max_new_incidents_per_request: int = 16
    max_runs_per_window: int = 30
    window_s: float = 3600.0


class AlertReceipt(BaseModel):
    """What was done with one alert."""

    incident_id: str
    alert_id: str | None
    status: AlertStatus
    run_started: bool
    """True only for the one delivery that emitted the event; repeats answer False."""


def incident_for(alert: Alert, book: IncidentBook, tenant: str, cluster: str) -> str:
    """The incident an alert belongs to (see the module docstring)."""
    if alert.incident_id is not None:
        return alert.incident_id
    # At most 63 characters, as isolation's incident ids (Kubernetes label values) must be.
    return book.open_incident(tenant, cluster, alert.job_id) or (
        f"{alert.job_id[:46].rstrip('._-')}-{alert.alert_time.strftime('%Y%m%dT%H%M%SZ')}")


class AlertIntake:
    """Records alerts and starts the incident flow through a :class:`FlowTrigger`."""

    def __init__(self, book: IncidentBook, trigger: FlowTrigger, store_uri: str, *,
                 limits: AlertLimits | None = None, clock: Callable[[], float] = time.time,
                 on_opened: Callable[[IncidentKey, str], None] | None = None) -> None:
        """``on_opened(key, job_id)`` is told of each incident whose run this delivery starts (its
        manifest may come from the job's registered layout alone: no rank uploaded)."""
        self.book = book
        self.on_opened = on_opened
        self.trigger = trigger
        self.store_uri = store_uri
        self.limits = limits or AlertLimits()
        self.clock = clock

    def receive(self, tenant: str, cluster: str, alerts: list[Alert]) -> list[AlertReceipt]:
        """Handle every alert of one delivery, in order.

        An alert naming an incident of another job is refused (409) before any alert of the
        delivery starts a run: it would otherwise take that incident's one run and point it at
        its own, empty, evidence folder. The book checks again inside each write (a race).
        """
        for alert in alerts:
            self._check_job(tenant, cluster, alert)
        self._check_limits(tenant, cluster, alerts)
        return [self._one(tenant, cluster, alert) for alert in alerts]

    def _check_limits(self, tenant: str, cluster: str, alerts: list[Alert]) -> None:
        """Refuse the whole delivery, before any run starts, when it passes a limit; the refusal is
        recorded (``refusals``) and answered 413 or 429, so the sender (Alertmanager retries)
        knows: nothing is dropped silently. Repeats of incidents that already run cost nothing."""
        limits = self.limits
        if len(alerts) > limits.max_alerts_per_request:
            reason = (f"the delivery holds {len(alerts)} alerts, more than the {limits.max_alerts_per_request} one "
                      "request may carry; split it (Alertmanager: group_by job_id, max_alerts)")
            self.book.record_refusal(tenant, cluster, status=413, alerts=len(alerts), reason=reason)
            raise PayloadTooLargeError(reason + "; nothing was started")
        new = self._new_incidents(tenant, cluster, alerts)
        now = self.clock()
        started = self.book.runs_started_since(tenant, cluster, now - limits.window_s)
        if len(new) > limits.max_new_incidents_per_request:
            reason = (f"the delivery would open {len(new)} incidents, more than the "
                      f"{limits.max_new_incidents_per_request} one request may open")
            retry = 1.0
        elif len(started) + len(new) > limits.max_runs_per_window:
            reason = (f"cluster {cluster!r} started {len(started)} incident runs in the last "
                      f"{limits.window_s / 60:.0f} min; {len(new)} more would pass its limit of "
                      f"{limits.max_runs_per_window}")
            retry = (started[0] + limits.window_s - now) if started else limits.window_s
        else:
            return
        self.book.record_refusal(tenant, cluster, status=429, alerts=len(alerts), reason=reason)
        raise RateLimitedError(reason + "; nothing was started, retry later", retry_after_s=int(retry) + 1)

    def _new_incidents(self, tenant: str, cluster: str, alerts: list[Alert]) -> set[str]:
        """The incidents of this delivery that would start a run now."""
        new = set()
        for alert in alerts:
            if alert.status is AlertStatus.RESOLVED:
                continue
            incident = incident_for(alert, self.book, tenant, cluster)
            record = self.book.record(IncidentKey(tenant, cluster, incident))
            if record is None or record.run_state is RunState.NOT_STARTED:
                new.add(incident)
        return new

    def _check_job(self, tenant: str, cluster: str, alert: Alert) -> None:
        if alert.incident_id is None:
            return  # it joins its own job's open incident, or opens one named after its job
        record = self.book.record(IncidentKey(tenant, cluster, alert.incident_id))
        if record is not None and record.job_id != alert.job_id:
            raise ConflictError(f"incident {alert.incident_id!r} belongs to job {record.job_id!r}, not "
                                f"{alert.job_id!r}; an alert cannot take another job's incident, and no run "
                                "was started for this delivery")

    def _one(self, tenant: str, cluster: str, alert: Alert) -> AlertReceipt:
        key = IncidentKey(tenant, cluster, incident_for(alert, self.book, tenant, cluster))
        when = alert.alert_time.isoformat()
        if alert.status is AlertStatus.RESOLVED:
            self.book.record_resolved(key, alert.job_id, when)
            record = self.book.record(key)
            return AlertReceipt(incident_id=key.incident_id, alert_id=record.alert_id if record else None,
                                status=alert.status, run_started=False)
        alert_id = self.book.claim_run(key, alert.job_id, world_size=alert.world_size, alert_time=when,
                                       reported_by_rank=alert.rank)
        if alert_id is None:
            record = self.book.record(key)
            return AlertReceipt(incident_id=key.incident_id, alert_id=record.alert_id if record else None,
                                status=alert.status, run_started=False)
        if self.on_opened is not None:
            self.on_opened(key, alert.job_id)
        event = AlertEvent(tenant=tenant, cluster=cluster, job_id=alert.job_id, incident_id=key.incident_id,
                           alert_time=alert.alert_time,
                           evidence=join_uri(self.store_uri, incident_prefix(tenant, cluster, alert.job_id,
                                                                             key.incident_id)),
                           world_size=self.book.world_size(key), reported_by_rank=alert.rank, alert_id=alert_id)
        try:
            self.trigger.start(event)
        except IngestError:
            self.book.finish_run_claim(key, started=False)
            raise
        self.book.finish_run_claim(key, started=True)
        return AlertReceipt(incident_id=key.incident_id, alert_id=alert_id, status=alert.status, run_started=True)
