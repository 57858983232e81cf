"""How one rank's dump reaches every rank: a shared request, through a file or the c10d store."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from denpex.collector.layout import request_path, write_exclusive

__all__ = ["DumpRequest", "DumpSignal", "FileDumpSignal", "StoreDumpSignal", "request_dump"]


class DumpRequest(BaseModel):
    """A request for every live rank to dump now."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requested_by: str = Field(description="'rank 3', or who else asked (e.g. 'operator')")
    reason: str
    requested_at: datetime


class DumpSignal(Protocol):
    """Carries one :class:`DumpRequest` to every rank of the job."""

    def send(self, request: DumpRequest) -> None:
        """Publish the request; the first request of an incident stays, later ones are dropped."""
        ...

    def receive(self) -> DumpRequest | None:
        """The published request, or None. Called from each rank's watchdog on every poll."""
        ...


class FileDumpSignal:
    """A request file in a folder every rank can read (a shared file system)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def send(self, request: DumpRequest) -> None:
        write_exclusive(self.path, request.model_dump_json().encode())

    def receive(self) -> DumpRequest | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return DumpRequest.model_validate_json(data)
        except ValidationError:
            # Someone wrote something else there: still a request to dump, say what it was.
            return DumpRequest(requested_by="unknown", reason=f"unreadable request at {self.path}",
                               requested_at=datetime.now(UTC))


class _Store(Protocol):
    """The part of ``torch.distributed.Store`` that :class:`StoreDumpSignal` uses."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...

    def add(self, key: str, amount: int) -> int: ...


class StoreDumpSignal:
    """A request key in the job's c10d store (TCPStore, FileStore), for jobs without a shared folder.

    The store must outlive the ranks that may fail: a TCPStore served by rank 0 dies with rank 0.
    """

    def __init__(self, store: _Store, key: str = "denpex/dump-request") -> None:
        self._store = store
        self._key = key

    def send(self, request: DumpRequest) -> None:
        # add() is atomic in every c10d store: only the first sender writes the request.
        if self._store.add(f"{self._key}/senders", 1) == 1:
            self._store.set(self._key, request.model_dump_json())

    def receive(self) -> DumpRequest | None:
        # check() never blocks; get() would wait for the key until the store timeout.
        if not self._store.check([self._key]):
            return None
        try:
            return DumpRequest.model_validate_json(self._store.get(self._key))
        except ValidationError:
            # As with the file signal: an unreadable value is still a request to dump.
            return DumpRequest(requested_by="unknown", reason=f"unreadable request at store key {self._key}",
                               requested_at=datetime.now(UTC))


def request_dump(out_dir: Path, reason: str, requested_by: str = "operator") -> DumpRequest:
    """Ask every rank whose :class:`HangDumper` watches ``out_dir`` to dump (e.g. from a shell)."""
    request = DumpRequest(requested_by=requested_by, reason=reason, requested_at=datetime.now(UTC))
    FileDumpSignal(request_path(out_dir)).send(request)
    return request
