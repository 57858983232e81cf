"""Request bodies on disk, never whole in memory, within bounds a stranger cannot push past.

A key id is not a secret, so a request whose headers pass may still come from anyone: its body
(up to 256 MiB) is streamed to a spool file while it is hashed, and only the hash decides. Three
bounds hold whatever the senders do:

- **bodies in flight** (``max_in_flight``): one more is refused at once, before a byte is read,
  with 503 and ``Retry-After``. 503 rather than 429: it is the service's capacity that is
  spent, not one tenant's rate (docs/contracts.md keeps 429 for a tenant's or cluster's limit).
  One source (the key id a signed request names, or a bearer token's tenant and cluster) holds
  at most ``max_in_flight_per_source`` of them, so a stranger who learned one key id cannot
  take the whole pool (it can deny that one key: its slots are taken before any signature is
  checked); bodies behind a bearer token (authenticated before the body) have a pool of their
  own, and unverified bodies may reserve at most three quarters of the spool's disk, so forged
  signed requests cannot starve Alertmanager.
- **the spool's disk** (``max_disk_bytes``): a body reserves its ``Content-Length`` before it
  is read (one that does not fit is refused at once, 503), and every byte written beyond a
  reservation (a chunked body, the dump part copied out of the body) must fit too.
- **the time a body may take** (uvicorn has none): ``grace_s`` plus the declared size at
  ``min_rate_bytes_s``, and never more than ``max_body_s``; a body still arriving then is 408.
  The rate holds all along, not only at the end: past ``grace_s``, a body that has not kept
  ``min_rate_bytes_s`` on average is cut off (408) at once, so a byte now and then holds a slot
  for ``grace_s``, not for the whole deadline.

Every spool file of a request is removed when the request ends, whatever happened (refusal,
disconnect, cancellation). Files are named ``<pid>-<random>.<kind>``, mode 0600; one left by a
process that no longer runs (a crash) is removed when the next service starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from denpex.ingest.errors import PayloadTooLargeError, RequestTimeoutError, StoreUnavailableError

__all__ = ["SpoolLimits", "SpoolBusyError", "SpooledFile", "SpoolSlot", "BodySpool", "spool_body"]

_GiB = 1 << 30
_MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class SpoolLimits:
    """The spool's folder and its bounds (module docstring)."""

    directory: Path
    max_in_flight: int = 64
    max_in_flight_per_source: int = 8
    max_disk_bytes: int = 4 * _GiB
    min_rate_bytes_s: int = 256 * 1024
    grace_s: float = 30.0
    max_body_s: float = 900.0

    def deadline_s(self, declared: int | None, cap: int) -> float:
        """Seconds a body of ``declared`` bytes (``cap`` when unknown) may take to arrive.

        >>> SpoolLimits(Path("/s")).deadline_s(64 * 1024 * 1024, 1 << 30)
        286.0
        """
        size = cap if declared is None else declared
        return min(self.max_body_s, self.grace_s + size / self.min_rate_bytes_s)


class SpoolBusyError(StoreUnavailableError):
    """503 with ``Retry-After``: the bound of bodies in flight or of spool disk is reached."""

    def __init__(self, message: str, retry_after_s: int = 5) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, int(retry_after_s))


@dataclass(frozen=True, slots=True)
class SpooledFile:
    """A file in the spool with its size and SHA-256, written once."""

    path: Path
    size: int
    sha256: str


@dataclass
class SpoolSlot:
    """One request's share of the spool: its reservation and its files (removed with the slot)."""

    spool: BodySpool
    authenticated: bool = False
    reserved: int = 0
    used: int = 0
    files: list[Path] = field(default_factory=list)

    def new_file(self, kind: str) -> tuple[Path, int]:
        """A fresh spool file (mode 0600, never an existing name) and its open descriptor."""
        path = self.spool.limits.directory / f"{os.getpid()}-{secrets.token_hex(8)}.{kind}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        self.files.append(path)
        return path, fd

    def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` written; past the reservation they must fit in the spool's bound (503)."""
        self.used += nbytes
        if self.used > self.reserved:
            self.spool.reserve(self, self.used - self.reserved)


class BodySpool:
    """The bounds of module docstring, shared by every request of one service."""

    def __init__(self, limits: SpoolLimits) -> None:
        self.limits = limits
        limits.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        self._in_flight = 0
        self._in_flight_authenticated = 0
        self._by_source: dict[str, int] = {}
        self._reserved = 0
        self._reserved_unverified = 0
        _remove_orphans(limits.directory)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of spool disk reserved right now."""
        return self._reserved

    @contextlib.contextmanager
    def admit(self, declared: int | None, *, source: str, authenticated: bool = False) -> Iterator[SpoolSlot]:
        """A slot for one body from ``source``, refused at once (503) when a bound is reached; freed
        on exit. ``authenticated``: the sender is proven already (a bearer token), so the body is
        not counted in the pool that unproven signed requests share."""
        with self._lock:
            held = self._by_source.get(source, 0)
            if held >= self.limits.max_in_flight_per_source:
                raise SpoolBusyError(f"this sender has {held} bodies arriving, its bound; nothing was stored, "
                                     "retry later")
            # Each pool has the bound of its own: unverified bodies cannot take the authenticated ones'.
            pool = self._in_flight_authenticated if authenticated else self._in_flight
            if pool >= self.limits.max_in_flight:
                raise SpoolBusyError(f"the service is receiving {pool} bodies, its bound; "
                                     "nothing was stored, retry later")
            self._by_source[source] = held + 1
            self._count(authenticated, +1)
        slot = SpoolSlot(self, authenticated=authenticated)
        try:
            if declared:
                self.reserve(slot, declared)
            yield slot
        finally:
            for path in slot.files:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            with self._lock:
                self._count(authenticated, -1)
                self._reserved -= slot.reserved
                if not authenticated:
                    self._reserved_unverified -= slot.reserved
                left = self._by_source.pop(source) - 1
                if left:
                    self._by_source[source] = left

    def _count(self, authenticated: bool, delta: int) -> None:
        if authenticated:
            self._in_flight_authenticated += delta
        else:
            self._in_flight += delta

    def reserve(self, slot: SpoolSlot, nbytes: int) -> None:
        """Add ``nbytes`` to ``slot``'s reservation, or refuse (503) when the disk bound would pass.
        Bodies whose sender is not proven yet may reserve at most three quarters of it, so that
        a declared ``Content-Length`` (free to send) cannot keep authenticated alerts out."""
        with self._lock:
            if self._reserved + nbytes > self.limits.max_disk_bytes:
                raise SpoolBusyError(f"the upload spool is full ({self._reserved:,} of "
                                     f"{self.limits.max_disk_bytes:,} bytes); nothing was stored, retry later")
            share = self.limits.max_disk_bytes * 3 // 4
            if not slot.authenticated and self._reserved_unverified + nbytes > share:
                raise SpoolBusyError(f"the upload spool is full for bodies not yet verified "
                                     f"({self._reserved_unverified:,} of {share:,} bytes); nothing was stored, "
                                     "retry later")
            self._reserved += nbytes
            slot.reserved += nbytes
            if not slot.authenticated:
                self._reserved_unverified += nbytes


async def spool_body(chunks: AsyncIterator[bytes], slot: SpoolSlot, *, cap: int, deadline_s: float) -> SpooledFile:
    """Stream a request body into a spool file while hashing it: 413 past ``cap``, 408 past the
    deadline or once it falls behind the spool's minimum rate (module docstring)."""
    limits = slot.spool.limits
    path, fd = slot.new_file("body")
    digest = hashlib.sha256()
    size = 0
    loop = asyncio.get_running_loop()
    started = loop.time()
    end = started + deadline_s

    def due() -> float:
        # By then more than ``size`` bytes must have come: the grace, then the minimum rate.
        return min(end, started + limits.grace_s + size / limits.min_rate_bytes_s)

    try:
        async with asyncio.timeout_at(due()) as timer:  # due() is a loop time, not a delay
            async for chunk in chunks:
                size += len(chunk)
                if size > cap:
                    raise PayloadTooLargeError(f"the body is over the {cap:,}-byte cap; nothing was stored")
                slot.charge(len(chunk))
                digest.update(chunk)
                # A write to the page cache, a few hundred microseconds per chunk: not worth a thread hop.
                _write_all(fd, chunk)
                timer.reschedule(due())
    except TimeoutError as exc:
        took = loop.time() - started
        why = (f"the body took longer than {deadline_s:.0f} s" if took >= deadline_s - 0.01 else
               f"the body arrived slower than {limits.min_rate_bytes_s:,} bytes/s after {limits.grace_s:.0f} s of grace")
        raise RequestTimeoutError(f"{why} ({size:,} bytes arrived in {took:.0f} s); nothing was stored, send it "
                                  "again faster") from exc
    finally:
        os.close(fd)
    return SpooledFile(path=path, size=size, sha256=digest.hexdigest())


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _remove_orphans(directory: Path) -> None:
    """Remove spool files whose process no longer runs (left by a crash)."""
    for path in directory.iterdir():
        pid_text = path.name.partition("-")[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                path.unlink()
        except PermissionError:
            pass  # alive, another user's
