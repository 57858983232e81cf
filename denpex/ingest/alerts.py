"""What alerting systems send, parsed once at the edge into one :class:`Alert` per hang report.

Three wire forms reach ``POST /v1/alerts``:

- Prometheus Alertmanager's webhook (payload ``version`` "4"): one ``Alert`` per entry of
  ``alerts[]``, from its labels (``job_id`` required; ``incident_id``, ``rank``, ``hostname``,
  ``world_size``, ``tenant``, ``cluster`` optional);
- Denpex's own alert JSON (:class:`DenpexAlert`), signed;
- the raw NCCL watchdog log line, as a log-based alert forwards it (``text/plain``, signed; the job
  comes from the ``job_id`` query parameter). Example::

    >>> line = ("[rank3]:[E1201 13:09:14.540958 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) "
    ...         "Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=16, "
    ...         "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600011 "
    ...         "milliseconds before timing out.")
    >>> w = parse_watchdog_line(line)
    >>> (w.rank, w.process_group, w.collective_seq_id, w.op, w.timeout_ms)
    (3, '0', 16, 'ALLREDUCE', 600000)
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from denpex.evidence.loading import validation_problems
from denpex.evidence.manifest import MAX_WORLD_SIZE
from denpex.ingest.errors import ForbiddenError, InvalidRequestError
from denpex.ingest.identity import ID_PATTERN, INCIDENT_ID_PATTERN

__all__ = ["AlertSource", "AlertStatus", "Alert", "DenpexAlert", "WatchdogTimeout", "parse_alertmanager",
           "parse_denpex_alert", "parse_watchdog_line", "alert_from_watchdog", "check_world_size"]

# Alertmanager's zero time for "not resolved yet".
_ZERO_TIME = "0001-01-01T00:00:00Z"
_ID = re.compile(ID_PATTERN)
_INCIDENT_ID = re.compile(INCIDENT_ID_PATTERN)
_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout: Work\w*\((?P<work>[^)]*(?:\([^)]*\)[^)]*)*)\)"
                       r"(?: ran for (?P<ran>\d+) milliseconds)?")
_RANK = re.compile(r"\[(?:PG ID \S+ PG GUID (?P<guid>[^ (\]]+)(?:\((?P<desc>[^)]*)\))? )?Rank (?P<rank>\d+)\]")
_RANK_PREFIX = re.compile(r"^\s*\[rank(?P<rank>\d+)\]")


class AlertSource(StrEnum):
    """Which wire form an alert came in."""

    ALERTMANAGER = "alertmanager"
    """Prometheus Alertmanager's webhook, authenticated by a bearer token."""
    DENPEX = "denpex"
    """Denpex's own signed alert JSON."""
    WATCHDOG_LINE = "watchdog_line"
    """A raw NCCL watchdog log line, signed."""


class AlertStatus(StrEnum):
    """Whether the alert is firing or was resolved."""

    FIRING = "firing"
    """The hang is (still) reported."""
    RESOLVED = "resolved"
    """The alerting system says the condition ended; recorded on the incident."""


class Alert(BaseModel):
    """One hang report, whatever wire form it came in."""

    model_config = ConfigDict(frozen=True)

    source: AlertSource
    status: AlertStatus
    job_id: str
    incident_id: str | None = None
    alert_time: datetime
    rank: int | None = None
    hostname: str | None = None
    world_size: int | None = None
    process_group: str | None = None
    collective_seq_id: int | None = None
    op: str | None = None


class DenpexAlert(BaseModel):
    """Denpex's own alert JSON (signed). Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(pattern=ID_PATTERN)
    incident_id: str | None = Field(default=None, pattern=INCIDENT_ID_PATTERN)
    status: AlertStatus = AlertStatus.FIRING
    alert_time: datetime | None = None
    rank: int | None = Field(default=None, ge=0)
    hostname: str | None = None
    world_size: int | None = Field(default=None, gt=0, le=MAX_WORLD_SIZE)
    process_group: str | None = None
    collective_seq_id: int | None = Field(default=None, ge=0)
    op: str | None = None


class WatchdogTimeout(BaseModel):
    """What one NCCL watchdog timeout line says."""

    model_config = ConfigDict(frozen=True)

    rank: int | None
    process_group: str | None
    process_group_desc: str | None
    collective_seq_id: int | None
    op: str | None
    timeout_ms: int | None
    ran_for_ms: int | None


def parse_watchdog_line(text: str) -> WatchdogTimeout:
    """Parse the watchdog's timeout line; anything else is a 422 naming what was expected."""
    match = _WATCHDOG.search(text)
    if match is None:
        raise InvalidRequestError("the text is not an NCCL watchdog timeout line (expected 'Watchdog caught "
                                  "collective operation timeout: WorkNCCL(SeqNum=..., OpType=..., ...)')")
    fields = dict(_work_fields(match.group("work")))
    rank_match = _RANK.search(text)
    prefix = _RANK_PREFIX.search(text)
    rank = rank_match.group("rank") if rank_match else (prefix.group("rank") if prefix else None)
    return WatchdogTimeout(
        rank=int(rank) if rank is not None else None,
        process_group=rank_match.group("guid") if rank_match else None,
        process_group_desc=rank_match.group("desc") if rank_match else None,
        collective_seq_id=_int(fields.get("SeqNum")),
        op=fields.get("OpType"),
        timeout_ms=_int(fields.get("Timeout(ms)")),
        ran_for_ms=_int(match.group("ran")),
    )


def alert_from_watchdog(text: str, *, job_id: str, incident_id: str | None, world_size: int | None,
                        received_at: datetime) -> Alert:
    """An :class:`Alert` from a watchdog line; the job comes from the request, not the line."""
    _check_id("job_id", job_id)
    if incident_id is not None:
        _check_id("incident_id", incident_id, _INCIDENT_ID)
    line = parse_watchdog_line(text)
    check_world_size(world_size)
    return Alert(source=AlertSource.WATCHDOG_LINE, status=AlertStatus.FIRING, job_id=job_id,
                 incident_id=incident_id, alert_time=received_at, rank=line.rank, world_size=world_size,
                 process_group=line.process_group, collective_seq_id=line.collective_seq_id, op=line.op)


def parse_denpex_alert(body: bytes, *, received_at: datetime) -> Alert:
    """Validate Denpex's alert JSON; every problem is named in one 422."""
    try:
        alert = DenpexAlert.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidRequestError(f"invalid Denpex alert: {validation_problems(exc)}") from exc
    return Alert(source=AlertSource.DENPEX, status=alert.status, job_id=alert.job_id,
                 incident_id=alert.incident_id, alert_time=_utc(alert.alert_time or received_at), rank=alert.rank,
                 hostname=alert.hostname, world_size=alert.world_size, process_group=alert.process_group,
                 collective_seq_id=alert.collective_seq_id, op=alert.op)


def parse_alertmanager(body: bytes, *, tenant: str, cluster: str, received_at: datetime) -> list[Alert]:
    """Alertmanager webhook payload version 4, for the token's tenant and cluster.

    A ``tenant`` or ``cluster`` label naming another one than the token's is refused (403): a
    token never speaks for anyone else.
    """
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidRequestError(f"the Alertmanager payload is not valid JSON ({exc})") from exc
    if not isinstance(payload, dict) or payload.get("version") != "4" or not isinstance(payload.get("alerts"), list):
        raise InvalidRequestError("not an Alertmanager webhook payload of version 4 (a JSON object with "
                                  "\"version\": \"4\" and a list \"alerts\")")
    alerts = []
    problems = []
    for index, entry in enumerate(payload["alerts"]):
        try:
            alerts.append(_alertmanager_alert(entry, tenant=tenant, cluster=cluster, received_at=received_at))
        except InvalidRequestError as exc:
            problems.append(f"alerts[{index}]: {exc}")
    if problems:
        raise InvalidRequestError("; ".join(problems))
    return alerts


def _alertmanager_alert(entry: Any, *, tenant: str, cluster: str, received_at: datetime) -> Alert:
    if not isinstance(entry, dict) or not isinstance(entry.get("labels"), dict):
        raise InvalidRequestError("an alert without a 'labels' object")
    labels = {str(k): str(v) for k, v in entry["labels"].items()}
    for name, own in (("tenant", tenant), ("cluster", cluster)):
        if name in labels and labels[name] != own:
            raise ForbiddenError(f"the alert's {name} label is {labels[name]!r} but the bearer token belongs to "
                                 f"{name} {own!r}; a token speaks for one tenant and cluster only")
    if "job_id" not in labels:
        raise InvalidRequestError("no 'job_id' label; add it to the alerting rule")
    _check_id("job_id", labels["job_id"])
    if "incident_id" in labels:
        _check_id("incident_id", labels["incident_id"], _INCIDENT_ID)
    status = AlertStatus.RESOLVED if entry.get("status") == "resolved" else AlertStatus.FIRING
    return Alert(source=AlertSource.ALERTMANAGER, status=status, job_id=labels["job_id"],
                 incident_id=labels.get("incident_id"), alert_time=_time(entry.get("startsAt")) or received_at,
                 rank=_label_int(labels, "rank"), hostname=labels.get("hostname"),
                 world_size=check_world_size(_label_int(labels, "world_size")), process_group=labels.get("process_group"),
                 collective_seq_id=_label_int(labels, "collective_seq_id"), op=labels.get("op"))


def check_world_size(world_size: int | None) -> int | None:
    """An alert's world size, bounded as uploads' are: the coverage view and the flow size work by it."""
    if world_size is not None and not 0 < world_size <= MAX_WORLD_SIZE:
        raise InvalidRequestError(f"world_size {world_size} is out of range: a job has 1 to {MAX_WORLD_SIZE:,} "
                                  "ranks")
    return world_size


def _work_fields(work: str) -> list[tuple[str, str]]:
    """``"SeqNum=16, OpType=ALLREDUCE, Timeout(ms)=600000"`` -> [("SeqNum", "16"), ...]."""
    pairs = []
    for part in work.split(","):
        name, sep, value = part.partition("=")
        if sep:
            pairs.append((name.strip(), value.strip()))
    return pairs


def _int(value: str | None) -> int | None:
    # At most 18 digits: an int64, and far below Python's int() digit limit (a 500 otherwise).
    return int(value) if value is not None and value.isascii() and value.isdigit() and len(value) <= 18 else None


def _label_int(labels: dict[str, str], name: str) -> int | None:
    if name not in labels:
        return None
    value = _int(labels[name])
    if value is None:
        raise InvalidRequestError(f"label {name}={labels[name]!r} is not a non-negative integer")
    return value


def _time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value or value == _ZERO_TIME:
        return None
    try:
        # Alertmanager writes nanoseconds; Python reads at most microseconds.
        text = re.sub(r"(\.\d{6})\d+", r"\1", value.replace("Z", "+00:00"))
        return _utc(datetime.fromisoformat(text))
    except ValueError as exc:
        raise InvalidRequestError(f"startsAt {value!r} is not an ISO time") from exc


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)


def _check_id(name: str, value: str, pattern: re.Pattern[str] = _ID) -> None:
    if not pattern.fullmatch(value):
        raise InvalidRequestError(f"{name} {value!r} is not a valid id: use A-Za-z0-9._- (at most 128, an "
                                  "incident id at most 63 and ending with a letter or digit), starting with "
                                  "a letter or digit")

