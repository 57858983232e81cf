"""Request bodies on disk, never whole in memory, within bounds a stranger cannot push past.

A body (up to 256 MiB) is streamed to a spool file while it is hashed. Every body belongs to one
**pool**, by what is known of its sender when it is admitted (:class:`SpoolPool`):

- ``signed``: a v2 request whose signature was checked from its headers, before a byte of the body
  was read or reserved; the sender holds the key's secret. A v1 request joins it once its
  signature verified.
- ``unverified``: a v1 request, whose signature can be checked only once its body arrived. A key
  id is not a secret, so anyone can send one: these bodies have a small allowance of their own
  (``max_unverified_bytes``, 256 MiB of the default 4 GiB spool) and one key id holds at most half
  of it, so a stranger who fills it blocks v1 senders, never a v2 one nor an Alertmanager.
- ``bearer``: an Alertmanager body whose token checked out from the headers, in a small pool of
  its own (``max_bearer_bytes``: alerts are at most 4 MiB).

Bounds, each answered at once with 503 and ``Retry-After`` (the service's capacity is spent, not
one tenant's rate: docs/contracts.md keeps 429 for that):

- **bodies in flight**: at most ``max_in_flight`` per pool, and ``max_in_flight_per_source`` per
  source (the key id, or a bearer token's tenant and cluster) in each pool; a forged v1 request
  never takes a slot of the key's signed bodies. The **tenant** that a verified signature or a
  checked bearer token proves has a bound of its own in that pool, over all its keys or clusters
  (``max_in_flight_per_tenant``, a quarter of the pool): a tenant that holds many keys (one per
  job, one per node agent) cannot take every slot from the other tenants. A v1 body not yet
  verified proves no tenant, so a stranger naming a tenant's key ids takes nothing of its share.
- **bytes reserved** (``max_disk_bytes`` in all): a body reserves its declared length when it is
  admitted, and every byte written beyond (a chunked body, the dump part copied out of the body)
  must fit too. Each pool has its own bytes, and one source holds at most its share of a pool:
  ``max_bytes_per_key`` of the signed pool, half of the others, and one tenant's keys together hold
  at most ``max_bytes_per_tenant`` of the signed pool (what one key may: more keys give a tenant
  no more disk), its bearer tokens what one token may. The signed pool is what the other two
  leave of the disk, so no pool can starve another. A body that alone needs more than its sender
  may ever hold can never fit: 413 at once, not a 503 to retry for ever.
- **the time a body may take** (uvicorn has none): ``grace_s`` plus the declared size at
  ``min_rate_bytes_s``, and never more than ``max_body_s``; a body still arriving then is 408.
  The rate holds all along, not only at the end: past ``grace_s``, a body that has not kept
  ``min_rate_bytes_s`` on average is cut off (408) at once.

Every bound is **per replica**: the spool is the process's own local disk, so each ``serve-api``
process bounds what it holds, whatever the others hold (a key that holds its share on every
replica holds a share of each disk, never more of any). What must hold across replicas, the nonce
cache and the rate limits, lives in the state database.

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
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from denpex.ingest.errors import PayloadTooLargeError, RequestTimeoutError, StoreUnavailableError
from denpex.ingest.signing import DeclaredBody, check_body

__all__ = ["SpoolPool", "SpoolLimits", "SpoolBusyError", "SpooledFile", "SpoolSlot", "BodySpool", "spool_body"]

_GiB = 1 << 30
_MiB = 1 << 20


class SpoolPool(StrEnum):
    """What is known of a body's sender when the body is admitted (module docstring)."""

    SIGNED = "signed"
    """A verified signature: v2 from its headers, or v1 once its body arrived and matched."""
    UNVERIFIED = "unverified"
    """A v1 signature not checked yet: anyone who knows a key id can send one."""
    BEARER = "bearer"
    """An Alertmanager body whose bearer token checked out from the headers."""


@dataclass(frozen=True, slots=True)
class SpoolLimits:
    """The spool's folder and its bounds (module docstring). A share left unset is a fraction of
    ``max_disk_bytes``: a sixteenth for unverified bodies, a sixty-fourth for bearer alerts and a
    quarter per key of signed bodies (256 MiB, 64 MiB and 1 GiB of the default 4 GiB). A tenant's
    keys together hold at most what one key may, and a quarter of the signed pool's slots."""

    directory: Path
    max_in_flight: int = 64
    max_in_flight_per_source: int = 8
    max_disk_bytes: int = 4 * _GiB
    max_unverified_bytes: int | None = None
    max_bearer_bytes: int | None = None
    max_bytes_per_key: int | None = None
    max_in_flight_per_tenant: int | None = None
    max_bytes_per_tenant: int | None = None
    min_rate_bytes_s: int = 256 * 1024
    grace_s: float = 30.0
    max_body_s: float = 900.0

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "max_in_flight_per_source", "max_in_flight_per_tenant", "max_bytes_per_tenant"):
            if (value := getattr(self, name)) is not None and value < 1:
                raise ValueError(f"the spool's {name} must be at least 1, not {value}")
        if self.pool_bytes(SpoolPool.SIGNED) <= 0:
            raise ValueError(f"the spool's {self.max_disk_bytes:,} bytes leave nothing for signed bodies once "
                             f"unverified ({self.pool_bytes(SpoolPool.UNVERIFIED):,}) and bearer "
                             f"({self.pool_bytes(SpoolPool.BEARER):,}) bodies have their shares; give the spool "
                             "more, or them less")

    def pool_bytes(self, pool: SpoolPool) -> int:
        """Bytes the bodies of ``pool`` may reserve together.

        >>> SpoolLimits(Path("/s")).pool_bytes(SpoolPool.UNVERIFIED) >> 20
        256
        """
        unverified = self.max_disk_bytes // 16 if self.max_unverified_bytes is None else self.max_unverified_bytes
        bearer = self.max_disk_bytes // 64 if self.max_bearer_bytes is None else self.max_bearer_bytes
        return {SpoolPool.UNVERIFIED: unverified, SpoolPool.BEARER: bearer,
                SpoolPool.SIGNED: self.max_disk_bytes - unverified - bearer}[pool]

    def source_bytes(self, pool: SpoolPool) -> int:
        """Bytes one source (a key id, a bearer token's cluster) may reserve in ``pool``: a v1 body
        larger than the unverified share is refused (413) before a byte is read.

        >>> SpoolLimits(Path("/s")).source_bytes(SpoolPool.UNVERIFIED) >> 20
        128
        """
        if pool is SpoolPool.SIGNED:
            per_key = self.max_disk_bytes // 4 if self.max_bytes_per_key is None else self.max_bytes_per_key
            return min(per_key, self.pool_bytes(pool))
        return self.pool_bytes(pool) // 2

    def tenant_in_flight(self) -> int:
        """Bodies one tenant's keys (or bearer tokens) may have arriving together in a pool: a
        quarter of the pool's slots by default, so that one tenant never holds them all.

        >>> SpoolLimits(Path("/s")).tenant_in_flight()
        16
        """
        if self.max_in_flight_per_tenant is not None:
            return self.max_in_flight_per_tenant
        return max(1, self.max_in_flight // 4)

    def tenant_bytes(self, pool: SpoolPool = SpoolPool.SIGNED) -> int:
        """Bytes one tenant's senders may reserve together in ``pool``: by default what one of
        them may, so that a tenant gains no disk by holding more keys or clusters.

        >>> SpoolLimits(Path("/s")).tenant_bytes() >> 20
        1024
        """
        if pool is SpoolPool.SIGNED and self.max_bytes_per_tenant is not None:
            return min(self.max_bytes_per_tenant, self.pool_bytes(pool))
        return self.source_bytes(pool)

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
    """One request's share of the spool: its pool, source and (once proven) tenant, its
    reservation and its files (removed with the slot)."""

    spool: BodySpool
    pool: SpoolPool
    source: str
    tenant: str | None = None
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
        """Count ``nbytes`` written; past the reservation they must fit in the slot's pool (503)."""
        self.used += nbytes
        if self.used > self.reserved:
            self.spool.reserve(self, self.used - self.reserved)


class BodySpool:
    """The bounds of the module docstring, shared by every request of one service process."""

    def __init__(self, limits: SpoolLimits) -> None:
        self.limits = limits
        limits.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        self._in_flight: Counter[SpoolPool] = Counter()
        self._in_flight_by_source: Counter[tuple[SpoolPool, str]] = Counter()
        self._bytes: Counter[SpoolPool] = Counter()
        self._bytes_by_source: Counter[tuple[SpoolPool, str]] = Counter()
        # Proven tenants only: a verified signature or a checked token (an unverified v1 body proves none).
        self._in_flight_by_tenant: Counter[tuple[SpoolPool, str]] = Counter()
        self._bytes_by_tenant: Counter[tuple[SpoolPool, str]] = Counter()
        _remove_orphans(limits.directory)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of spool disk reserved right now, every pool together."""
        return sum(self._bytes.values())

    def reserved_in(self, pool: SpoolPool) -> int:
        """Bytes reserved right now by the bodies of ``pool``."""
        return self._bytes[pool]

    @contextlib.contextmanager
    def admit(self, declared: int | None, *, pool: SpoolPool, source: str,
              tenant: str | None = None) -> Iterator[SpoolSlot]:
        """A slot in ``pool`` for one body from ``source`` (of ``tenant``, once proven) that
        declares ``declared`` bytes, refused at once (503) when a bound is reached; freed on exit."""
        slot = SpoolSlot(self, pool=pool, source=source, tenant=_proven_tenant(pool, tenant))
        with self._lock:
            self._take_place(slot.pool, slot.source, slot.tenant)
        try:
            if declared:
                self.reserve(slot, declared)
            yield slot
        finally:
            for path in slot.files:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            with self._lock:
                self._release(slot.pool, slot.source, slot.tenant, slot.reserved)

    def promote(self, slot: SpoolSlot, *, pool: SpoolPool, source: str, tenant: str | None = None) -> None:
        """Move ``slot`` and its reservation to ``pool`` as ``source`` of ``tenant`` (a v1 body whose
        signature verified leaves the unverified allowance), or refuse (503) when it does not fit there."""
        tenant = _proven_tenant(pool, tenant)
        with self._lock:
            self._take_place(pool, source, tenant)
            try:
                self._check_bytes(pool, source, tenant, slot.reserved)
            except SpoolBusyError:
                self._release(pool, source, tenant, 0)
                raise
            self._release(slot.pool, slot.source, slot.tenant, slot.reserved)
            self._add_bytes(pool, source, tenant, slot.reserved)
            slot.pool, slot.source, slot.tenant = pool, source, tenant

    def reserve(self, slot: SpoolSlot, nbytes: int) -> None:
        """Add ``nbytes`` to ``slot``'s reservation, or refuse: 503 when its pool, its source's or
        tenant's share of the pool, or the disk would pass its bound; 413 when the slot alone would
        need more than its sender may ever hold."""
        self._check_fits_at_all(slot, slot.reserved + nbytes)
        with self._lock:
            self._check_bytes(slot.pool, slot.source, slot.tenant, nbytes)
            self._add_bytes(slot.pool, slot.source, slot.tenant, nbytes)
            slot.reserved += nbytes

    def _take_place(self, pool: SpoolPool, source: str, tenant: str | None) -> None:
        held = self._in_flight_by_source[pool, source]
        if held >= self.limits.max_in_flight_per_source:
            raise SpoolBusyError(f"this sender has {held} bodies arriving, its bound; nothing was stored, "
                                 "retry later")
        ours = self._in_flight_by_tenant[pool, tenant] if tenant is not None else 0
        if tenant is not None and ours >= self.limits.tenant_in_flight():
            raise SpoolBusyError(f"this tenant's senders have {ours} {pool.value} bodies arriving, its bound; "
                                 "nothing was stored, retry later")
        if self._in_flight[pool] >= self.limits.max_in_flight:
            raise SpoolBusyError(f"the service is receiving {self._in_flight[pool]} {pool.value} bodies, its bound; "
                                 "nothing was stored, retry later")
        self._in_flight_by_source[pool, source] += 1
        self._in_flight[pool] += 1
        if tenant is not None:
            self._in_flight_by_tenant[pool, tenant] += 1

    def _release(self, pool: SpoolPool, source: str, tenant: str | None, nbytes: int) -> None:
        self._in_flight_by_source[pool, source] -= 1
        self._in_flight[pool] -= 1
        self._add_bytes(pool, source, tenant, -nbytes)
        # Sources come and go (every key id a stranger names): forget those that hold nothing.
        for counter in (self._in_flight_by_source, self._bytes_by_source):
            if counter[pool, source] <= 0:
                del counter[pool, source]
        if tenant is not None:
            self._in_flight_by_tenant[pool, tenant] -= 1
            if self._in_flight_by_tenant[pool, tenant] <= 0:
                del self._in_flight_by_tenant[pool, tenant]
                self._bytes_by_tenant.pop((pool, tenant), None)

    def _add_bytes(self, pool: SpoolPool, source: str, tenant: str | None, nbytes: int) -> None:
        self._bytes[pool] += nbytes
        self._bytes_by_source[pool, source] += nbytes
        if tenant is not None:
            self._bytes_by_tenant[pool, tenant] += nbytes

    def _check_bytes(self, pool: SpoolPool, source: str, tenant: str | None, nbytes: int) -> None:
        limits = self.limits
        total = self.reserved_bytes
        if total + nbytes > limits.max_disk_bytes:
            raise SpoolBusyError(f"the upload spool is full ({total:,} of {limits.max_disk_bytes:,} bytes); nothing "
                                 "was stored, retry later")
        held, bound = self._bytes[pool], limits.pool_bytes(pool)
        if held + nbytes > bound:
            raise SpoolBusyError(f"the upload spool is full for {pool.value} bodies ({held:,} of {bound:,} bytes); "
                                 f"nothing was stored, retry later{_V2_HINT if pool is SpoolPool.UNVERIFIED else ''}")
        mine, share = self._bytes_by_source[pool, source], limits.source_bytes(pool)
        if mine + nbytes > share:
            raise SpoolBusyError(f"this sender holds {mine:,} bytes of {pool.value} bodies and asks for {nbytes:,} "
                                 f"more, past its share of {share:,}; nothing was stored, retry later"
                                 f"{_V2_HINT if pool is SpoolPool.UNVERIFIED else ''}")
        if tenant is not None:
            ours, bound = self._bytes_by_tenant[pool, tenant], limits.tenant_bytes(pool)
            if ours + nbytes > bound:
                raise SpoolBusyError(f"this tenant's senders hold {ours:,} bytes of {pool.value} bodies and ask for "
                                     f"{nbytes:,} more, past the tenant's share of {bound:,}; nothing was stored, "
                                     "retry later")

    def _check_fits_at_all(self, slot: SpoolSlot, total: int) -> None:
        """413 for a body that, alone in an empty spool, would pass a bound: a retry never fits."""
        limits = self.limits
        bound = min(limits.pool_bytes(slot.pool), limits.source_bytes(slot.pool))
        if slot.tenant is not None:
            bound = min(bound, limits.tenant_bytes(slot.pool))
        if total > bound:
            raise PayloadTooLargeError(f"this body needs {total:,} bytes of spool, more than its sender may ever hold "
                                       f"({bound:,}, the service's --max-spool-bytes* options); nothing was stored")


def _proven_tenant(pool: SpoolPool, tenant: str | None) -> str | None:
    """The tenant a body is counted against: a verified signature or a checked token proves one,
    an unverified v1 signature none (a key id is no secret)."""
    return None if pool is SpoolPool.UNVERIFIED else tenant


_V2_HINT = " (or sign v2: its signature is checked before anything is reserved)"


async def spool_body(chunks: AsyncIterator[bytes], slot: SpoolSlot, *, cap: int, deadline_s: float,
                     declared: DeclaredBody | None = None) -> SpooledFile:
    """Stream a request body into a spool file while hashing it: 413 past ``cap``, 408 past the
    deadline or once it falls behind the spool's minimum rate (module docstring). With the
    ``declared`` body of a v2 signature, the body must be exactly that (401): one byte past its
    length is refused at once, and nothing past what was reserved for it is ever written."""
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
                if declared is not None and size > declared.length:
                    check_body(declared, size=size, sha256="")
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
    if declared is not None:
        check_body(declared, size=size, sha256=digest.hexdigest())
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
