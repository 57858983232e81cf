"""The blast-radius circuit breaker's persistent state.

Once tripped, the breaker stays tripped across runs and processes until a named person resets
it: an automated workflow that suddenly wants to isolate many nodes is more likely reacting to a
fabric-wide fault (or a bug) than to many broken GPUs. The state is one small JSON file in the
machine-wide state directory, written atomically under an exclusive lock, so concurrent
executors see one truth.

It also remembers each isolation Denpex sent (cluster, node, incident, time) for a day, so
that the per-cluster rate limit (``SafetyLimits.max_isolations_per_cluster_per_hour``) holds
across incidents: one bad switch opens many incidents, each within its own limits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from denpex.evidence.loading import FileKind, read_model
from denpex.isolation.errors import ConfigError
from denpex.isolation.file_lock import file_lock

__all__ = ["IsolationMark", "BreakerState", "CircuitBreaker"]

_MAX_STATE_BYTES = 16 * 1024 * 1024
_STATE_FILE = FileKind("breaker state", invalid="breaker state is damaged",
                       unparsable="breaker state is damaged (not JSON)",
                       hint="inspect it, then reset with `denpex breaker reset --by NAME`")
_KEEP_MARKS = timedelta(days=1)
_HOUR = timedelta(hours=1)


class IsolationMark(BaseModel):
    """One isolation Denpex sent, for the per-cluster rate limit."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster: str
    node: str
    incident_id: str
    at: datetime


class BreakerState(BaseModel):
    """Whether automated isolation is allowed, and the story of the last trip and reset."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tripped: bool = False
    tripped_at: datetime | None = None
    tripped_by_incident: str | None = None
    trip_reason: str | None = None
    reset_by: str | None = None
    reset_at: datetime | None = None
    isolations: tuple[IsolationMark, ...] = ()
    """Isolations sent in the last day, oldest first."""

    def isolations_since(self, cluster: str, since: datetime) -> list[IsolationMark]:
        return [m for m in self.isolations if m.cluster == cluster and m.at >= since]


class CircuitBreaker:
    """The breaker stored at ``path`` (created on first trip; a missing file means closed)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def state(self) -> BreakerState:
        """The current state. Reading takes no lock and creates nothing: every write replaces the
        file atomically, and a dry run (or an operator who may only read the state directory)
        must leave no trace there."""
        return self._read()

    def trip(self, *, reason: str, incident_id: str, at: datetime) -> BreakerState:
        """Open the breaker. A breaker already open keeps its first trip's story."""
        with self._locked():
            current = self._read()
            if current.tripped:
                return current
            new = current.model_copy(update={
                "tripped": True, "tripped_at": at, "tripped_by_incident": incident_id, "trip_reason": reason,
            })
            self._write(new)
            return new

    def record_isolation(self, *, cluster: str, node: str, incident_id: str, at: datetime) -> BreakerState:
        """Remember an isolation sent (marks older than a day are dropped). The same incident
        sending it to the same node again within the hour (a retry) is not a second one."""
        with self._locked():
            current = self._read()
            if any((m.cluster, m.node, m.incident_id) == (cluster, node, incident_id) and m.at >= at - _HOUR
                   for m in current.isolations):
                return current
            kept = tuple(m for m in current.isolations if m.at >= at - _KEEP_MARKS)
            mark = IsolationMark(cluster=cluster, node=node, incident_id=incident_id, at=at)
            new = current.model_copy(update={"isolations": (*kept, mark)})
            self._write(new)
            return new

    def reset(self, *, by: str, at: datetime) -> BreakerState:
        """Close the breaker; only a person does this, so ``by`` must name one."""
        if not by.strip():
            raise ConfigError("breaker reset needs the name of the person resetting it (--by NAME)")
        with self._locked():
            try:
                current = self._read()
            except ConfigError:
                current = BreakerState()  # a person resetting a damaged file starts it afresh
            new = current.model_copy(update={"tripped": False, "reset_by": by.strip(), "reset_at": at})
            self._write(new)
            return new

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with file_lock(self.path.with_name(self.path.name + ".lock"), what="the breaker lock", error=ConfigError):
            yield

    def _read(self) -> BreakerState:
        if not os.path.lexists(self.path):  # only a missing file is a fresh breaker; a broken link is an error
            return BreakerState()
        # A damaged state file must not silently re-enable automation: it is an error, never a default.
        return read_model(self.path, BreakerState, max_bytes=_MAX_STATE_BYTES, kind=_STATE_FILE, error=ConfigError)

    def _write(self, state: BreakerState) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(state.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
            with tmp.open("rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot write breaker state: {exc.strerror or exc}") from exc
