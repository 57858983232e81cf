"""Accepting one rank's dump: check, hash, version, store, record, rebuild the manifest.

    checked identity + the dump's spool file (never whole in this process)
      -> safe loader in a worker process (422 when refused)
      -> the incident's job must be the upload's (409 otherwise)
      -> sha256 (computed as the dump was spooled); the same bytes again for this rank ->
         {"stored": false} (idempotent), but its telemetry files (and stacks that version lacks) are
         still taken on their own
      -> a new version (a pickle and its JSON of one moment share one), never an overwrite
      -> objects written: versions/..., telemetry/..., rank_<r>.<ext>, telemetry.json, and the stacks
         that came with the dump: versions/rank_<r>/v<N>[.py-spy].stacks.json and, for the newest
         version, collector/rank_<r>[.py-spy].stacks.json (a new version without them removes the
         older version's from collector/, so triage never reads an old stack beside a new dump)
      -> the database row, last
      -> manifest.json, from the identities, by :class:`ManifestWriter` (within its interval)

A refused request leaves nothing (issue 16, finding 14). Objects are written before the row, so
any failure after the first write (the store refusing one write of several, the state database
busy past its timeout, a bug) used to leave them behind: a ``versions/`` object no row knows,
and, worse, a ``rank_<r>`` file holding bytes that were never acknowledged, which triage would
read. Now every change is undone before the refusal is answered: new objects are deleted, and
the names this upload overwrote or removed (``rank_<r>.<ext>``, ``telemetry.json``) are put back
as the recorded uploads say they were. Only a store that refuses the undo as well can keep an
object (it is logged); that leftover is never recorded, and the retry writes the same names.
"""

from __future__ import annotations

import logging
import json
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from denpex.evidence.errors import EvidenceError
from denpex.evidence.fr_dump import DumpEncoding
from denpex.evidence.stacks import MAX_BYTES as MAX_STACKS_BYTES
from denpex.evidence.stacks import StackSource
from denpex.evidence.store import EvidenceStore
from denpex.hardware.stored_telemetry import TELEMETRY_INDEX, TelemetryIndex, TrustedFile
from denpex.ingest.auth import Caller
from denpex.ingest.database import Database
from denpex.ingest.dump_check import DumpCheck, DumpChecker
from denpex.ingest.errors import (
    ConflictError,
    ForbiddenError,
    NotFoundError,
    StoreUnavailableError,
)
from denpex.ingest.identity import TelemetryIdentity, UploadIdentity
from denpex.ingest.incidents import IncidentBook, IncidentKey, StoredStacks, StoredTelemetry, StoredUpload
from denpex.ingest.layout import (
    current_dump_name,
    current_stacks_name,
    incident_prefix,
    stacks_version_name,
    version_name,
)
from denpex.ingest.manifest_writer import ManifestWriter
from denpex.ingest.stacks_check import CheckedStacks, check_stacks_parts
from denpex.ingest.telemetry_caps import new_telemetry
from denpex.ingest.upload_form import STACKS_PARTS, DumpPart

__all__ = ["UploadReceipt", "TelemetryReceipt", "EvidenceIntake"]

_log = logging.getLogger(__name__)


class UploadReceipt(BaseModel):
    """The answer to an upload (docs/contracts.md), plus how many telemetry files were new."""

    stored: bool
    sha256: str
    version: int
    telemetry_stored: int = 0
    """Telemetry files of this request the incident did not hold yet (stored now, even when the dump
    itself was an identical re-upload)."""
    stacks_stored: int = 0
    """Stacks parts of this request that the dump's version did not hold yet (0 for the same bytes again)."""


class TelemetryReceipt(BaseModel):
    """The answer to a node agent's telemetry-only upload."""

    stored: bool
    """False when the incident held every file already (an identical re-send)."""
    incident_id: str
    telemetry_stored: int


@dataclass
class _Locks:
    """One lock per incident: versions of one rank are numbered one at a time."""

    guard: threading.Lock = field(default_factory=threading.Lock)
    by_incident: dict[IncidentKey, threading.Lock] = field(default_factory=lambda: defaultdict(threading.Lock))

    def of(self, key: IncidentKey) -> threading.Lock:
        with self.guard:
            return self.by_incident[key]


@dataclass
class _Undo:
    """What one upload changed in the store, newest first, to put back if it is refused."""

    steps: list[tuple[str, Callable[[], None]]] = field(default_factory=list)

    def add(self, what: str, undo: Callable[[], None]) -> None:
        self.steps.append((what, undo))

    def run(self) -> None:
        for what, undo in reversed(self.steps):
            try:
                undo()
            except Exception:  # noqa: BLE001 - undo the rest whatever one step does
                _log.exception("could not undo %s of a refused upload; the object stays, unrecorded", what)


class EvidenceIntake:
    """Accepts uploads into one store, with bookkeeping in the state database."""

    def __init__(self, store: EvidenceStore, book: IncidentBook, checker: DumpChecker,
                 manifests: ManifestWriter, db: Database, *, max_dump_bytes: int) -> None:
        self.store = store
        self.max_dump_bytes = max_dump_bytes
        self.book = book
        self.checker = checker
        self.manifests = manifests
        self._db = db
        self._locks = _Locks()

    def accept(self, caller: Caller, identity: UploadIdentity, dump: DumpPart,
               telemetry: list[bytes], stacks: dict[StackSource, bytes] | None = None) -> UploadReceipt:
        """Store one rank's dump (and telemetry, and stacks) or refuse it; see the module docstring."""
        identity = _bound_to_host(caller, identity)
        sent_stacks = check_stacks_parts(stacks or {}, identity.rank)
        check = self._check(dump, caller)
        sha256 = dump.file.sha256
        key = IncidentKey(caller.tenant, caller.cluster, identity.incident_id)
        with self._locks.of(key):
            self._check_job(key, identity.job_id)
            earlier = self.book.uploads(key, identity.rank)
            # Re-sending the identical dump with the host's telemetry changes nothing of the rank's.
            changes_rank = bool(sent_stacks) or not any(u.sha256 == sha256 for u in earlier)
            _check_rank_host(caller, identity, earlier, changes_rank=changes_rank)
            if caller.host is not None:  # nor a rank that the job's registration places on another host
                _check_rank_host_registered(caller, identity,
                                            self.manifests.registered_host(key, identity.job_id, identity.rank))
            known = self.book.telemetry(key)
            base = incident_prefix(key.tenant, key.cluster, identity.job_id, key.incident_id)
            items = new_telemetry(telemetry, caller, known)
            held_stacks = self.book.stacks(key, identity.rank)
            same = next((u for u in earlier if u.sha256 == sha256), None)
            if same is not None:
                new_stacks = _new_stacks(sent_stacks, identity.rank, same.version, held_stacks)
                self._store_telemetry_alone(key, base, caller, items, known)
                self._store_stacks_alone(key, base, caller, new_stacks, earlier, held_stacks)
                return UploadReceipt(stored=False, sha256=sha256, version=same.version,
                                     telemetry_stored=len(items), stacks_stored=len(new_stacks))
            version = _version_for(earlier, check.encoding, identity)
            new_stacks = _new_stacks(sent_stacks, identity.rank, version, held_stacks)
            upload = StoredUpload(rank=identity.rank, version=version, encoding=check.encoding, sha256=sha256,
                                  object_name=version_name(identity.rank, version, check.encoding),
                                  key_id=caller.key_id, identity=identity.model_dump_json(exclude_none=True),
                                  uploaded_at=time.time())
            joins = any(u.version == version for u in earlier)
            undo = _Undo()
            try:
                self._write(base, upload, dump.file.path, items, earlier, known, undo, joins_version=joins)
                self._write_stacks(base, identity.rank, new_stacks, earlier, held_stacks, undo, current=True,
                                   drop_stale=not joins)
                recorded = self.book.record_upload(key, identity.job_id, upload, identity.world_size,
                                                   [item for item, _ in items], [item for item, _ in new_stacks])
            except BaseException as exc:
                undo.run()
                if isinstance(exc, EvidenceError):
                    raise StoreUnavailableError(f"the evidence store cannot be written ({exc}); nothing was "
                                                "acknowledged, retry the upload") from exc
                if isinstance(exc, sqlite3.Error):
                    raise StoreUnavailableError(f"the state database is unavailable ({exc}); nothing was "
                                                "stored, retry the upload") from exc
                raise
            if not recorded:
                # Only another process serving this state could have recorded these names meanwhile;
                # they are its objects now, so nothing is undone.
                raise StoreUnavailableError(f"another upload of rank {identity.rank} version {version} was "
                                            "recorded at the same time; retry the upload")
            self.manifests.add(key, identity)
        return UploadReceipt(stored=True, sha256=sha256, version=version, telemetry_stored=len(items),
                             stacks_stored=len(new_stacks))

    def accept_telemetry(self, caller: Caller, identity: TelemetryIdentity, telemetry: list[bytes]) -> TelemetryReceipt:
        """A node agent's telemetry without a dump: the rank on its host may have died without one.

        Only a host-bound key may send it (403): telemetry alone is worth something only when it
        can support a drain, and only a node agent's key can. It joins the named incident, which a
        dump or an alert opened (404: telemetry alone opens none), or, unnamed, the job's one open
        incident (404 when none, 409 when several: any key of the cluster can open one, and must not
        divert the agents' telemetry to it). The caps of :mod:`denpex.ingest.telemetry_caps` hold
        (413), so that no key can grow ``telemetry.json`` or the incident's telemetry without bound.
        """
        if caller.host is None:
            raise ForbiddenError("a telemetry upload without a dump needs a key bound to its host (a node agent's "
                                 "key: denpex keys create --host HOST); a job's key uploads telemetry with a dump")
        if identity.host is not None and identity.host != caller.host:
            raise ForbiddenError(f"this key is bound to host {caller.host!r}; it sends that host's telemetry only, "
                                 f"not {identity.host!r}'s")
        incident_id = identity.incident_id or _the_open_incident(self.book, caller, identity.job_id)
        key = IncidentKey(caller.tenant, caller.cluster, incident_id)
        with self._locks.of(key):
            if self.book.record(key) is None:
                raise NotFoundError(f"no incident {incident_id!r} of job {identity.job_id!r}; telemetry alone opens "
                                    "none: send it once the job's ranks or its alert opened the incident")
            self._check_job(key, identity.job_id)
            known = self.book.telemetry(key)
            items = new_telemetry(telemetry, caller, known)
            if items:
                base = incident_prefix(key.tenant, key.cluster, identity.job_id, key.incident_id)
                self._store_telemetry_alone(key, base, caller, items, known)
        return TelemetryReceipt(stored=bool(items), incident_id=incident_id, telemetry_stored=len(items))

    def _check(self, dump: DumpPart, caller: Caller) -> DumpCheck:
        """The worker's check of the spooled file: the worker reads it, this process never holds the dump."""
        return self.checker.check(dump.file.path, dump.filename, tenant=caller.tenant)

    def _check_job(self, key: IncidentKey, job_id: str) -> None:
        record = self.book.record(key)
        if record is not None and record.job_id != job_id:
            raise ConflictError(f"incident {key.incident_id!r} belongs to job {record.job_id!r}, not "
                                f"{job_id!r}; each hang of each job has its own incident id")

    def _store_telemetry_alone(self, key: IncidentKey, base: str, caller: Caller,
                               items: list[tuple[StoredTelemetry, bytes]], known: list[StoredTelemetry]) -> None:
        """An identical dump re-sent with new telemetry: the telemetry is stored and recorded on its own."""
        if not items:
            return
        with _all_or_nothing("the telemetry") as undo:
            self._write_telemetry(base, items, known, undo)
            _record_telemetry(self._db, key, [item for item, _ in items], caller.key_id, time.time())

    def _store_stacks_alone(self, key: IncidentKey, base: str, caller: Caller,
                            items: list[tuple[StoredStacks, bytes]], earlier: list[StoredUpload],
                            held: list[StoredStacks]) -> None:
        """An identical dump re-sent with stacks its version lacks: they are stored and recorded on
        their own (and made current when that version is the rank's newest)."""
        if not items:
            return
        newest = max(u.version for u in earlier)
        with _all_or_nothing("the stacks") as undo:
            self._write_stacks(base, items[0][0].rank, items, earlier, held, undo,
                               current=items[0][0].version == newest, drop_stale=False)
            self.book.record_stacks(key, [item for item, _ in items], caller.key_id, time.time())

    def _write_stacks(self, base: str, rank: int, items: list[tuple[StoredStacks, bytes]],
                      earlier: list[StoredUpload], held: list[StoredStacks], undo: _Undo, *, current: bool,
                      drop_stale: bool) -> None:
        """The version's stacks objects; with ``current``, also ``collector/`` (where triage reads);
        with ``drop_stale``, the sources this new version lacks are removed from ``collector/``."""
        for item, data in items:
            name = f"{base}/{item.object_name}"
            undo.add(name, self._deleter(name))
            self.store.write(name, data)
        if not current:
            return
        sent = {item.source for item, _ in items}
        for source in STACKS_PARTS.values():
            if source not in sent and not drop_stale:
                continue
            name = f"{base}/{current_stacks_name(rank, source)}"
            undo.add(name, self._stacks_restorer(base, rank, source, earlier, held))
            sent_data = next((d for item, d in items if item.source is source), None)
            if sent_data is not None:
                self.store.write(name, sent_data)
            else:
                self.store.delete(name)

    def _stacks_restorer(self, base: str, rank: int, source: StackSource, earlier: list[StoredUpload],
                         held: list[StoredStacks]) -> Callable[[], None]:
        """Put ``collector/rank_<r>[.py-spy].stacks.json`` back as the records say it was: the newest
        recorded version's stacks of that source, or none."""
        newest = max((u.version for u in earlier), default=None)
        kept = next((h for h in held if h.version == newest and h.source is source), None)
        name = f"{base}/{current_stacks_name(rank, source)}"
        if kept is None:
            return self._deleter(name)
        return lambda: self.store.write(name, self.store.read(f"{base}/{kept.object_name}", max_bytes=MAX_STACKS_BYTES))

    def _write(self, base: str, upload: StoredUpload, dump: Path, items: list[tuple[StoredTelemetry, bytes]],
               earlier: list[StoredUpload], known: list[StoredTelemetry], undo: _Undo, *,
               joins_version: bool) -> None:
        version_object = f"{base}/{upload.object_name}"
        # The immutable version first: whatever fails later, an accepted version is never overwritten.
        undo.add(version_object, self._deleter(version_object))
        self.store.write_file(version_object, dump)
        self._write_telemetry(base, items, known, undo, index=False)
        current = current_dump_name(upload.rank, upload.encoding)
        undo.add(f"{base}/{current}", lambda: self._restore_current(base, upload.rank, upload.encoding, earlier))
        self.store.write_file(f"{base}/{current}", dump)
        if upload.version > 1 and not joins_version:
            # The other encoding of the previous version must not stand beside this one:
            # triage would read the old pickle over a new JSON.
            other = DumpEncoding.JSON if upload.encoding is DumpEncoding.PICKLE else DumpEncoding.PICKLE
            undo.add(f"{base}/{current_dump_name(upload.rank, other)}",
                     lambda: self._restore_current(base, upload.rank, other, earlier))
            self.store.delete(f"{base}/{current_dump_name(upload.rank, other)}")
        if items or known:
            self._write_index(base, [item for item, _ in items], known, undo)

    def _write_telemetry(self, base: str, items: list[tuple[StoredTelemetry, bytes]], known: list[StoredTelemetry],
                         undo: _Undo, *, index: bool = True) -> None:
        for item, data in items:
            name = f"{base}/{item.object_name}"
            undo.add(name, self._deleter(name))
            self.store.write(name, data)
        if index and items:
            self._write_index(base, [item for item, _ in items], known, undo)

    def _write_index(self, base: str, items: list[StoredTelemetry], known: list[StoredTelemetry], undo: _Undo) -> None:
        name = f"{base}/{TELEMETRY_INDEX}"
        undo.add(name, lambda: self.store.write(name, _index(known)) if known else self.store.delete(name))
        self.store.write(name, _index(known + items))

    def _deleter(self, name: str) -> Callable[[], None]:
        return lambda: self.store.delete(name)

    def _restore_current(self, base: str, rank: int, encoding: DumpEncoding, earlier: list[StoredUpload]) -> None:
        """Put ``rank_<r>.<ext>`` back as the recorded uploads say it was (or remove it: there was none)."""
        name = f"{base}/{current_dump_name(rank, encoding)}"
        # rank_<r>.<ext> holds the newest version's member of that encoding; an older version's
        # other encoding was removed when a newer version came.
        newest = max((u.version for u in earlier), default=None)
        member = next((u for u in earlier if u.version == newest and u.encoding is encoding), None)
        if member is None:
            self.store.delete(name)
            return
        # A refused upload is rare; reading the kept version back once is the price of putting it back.
        self.store.write(name, self.store.read(f"{base}/{member.object_name}", max_bytes=self.max_dump_bytes))


def _index(telemetry: list[StoredTelemetry]) -> bytes:
    every = {t.object_name: t for t in telemetry}
    index = TelemetryIndex(
        trusted=[TrustedFile(name=name, host=t.host) for name, t in sorted(every.items()) if t.trusted and t.host],
        untrusted=[name for name, t in sorted(every.items()) if not t.trusted])
    return index.model_dump_json(indent=1).encode()


def _the_open_incident(book: IncidentBook, caller: Caller, job_id: str) -> str:
    """The job's one open incident, which telemetry without an incident id joins."""
    open_ = book.incidents_of_job(caller.tenant, caller.cluster, job_id, limit=2)
    if not open_:
        raise NotFoundError(f"job {job_id!r} has no open incident; name it (incident_id) or send the "
                            "telemetry once the job's ranks or its alert opened one")
    if len(open_) > 1:
        raise ConflictError(f"job {job_id!r} has several open incidents; name the one this telemetry is for "
                            "(incident_id, denpex node-agent --incident)")
    return open_[0]


def _record_telemetry(db: Database, key: IncidentKey, items: list[StoredTelemetry], key_id: str, now: float) -> None:
    """Telemetry rows without a new dump row (the dump was an identical re-upload)."""
    with db.connect() as conn:
        for item in items:
            conn.execute("INSERT OR IGNORE INTO telemetry (tenant, cluster, incident_id, sha256, object_name, "
                         "trusted, host, key_id, uploaded_at, size) VALUES (?,?,?,?,?,?,?,?,?,?)",
                         (key.tenant, key.cluster, key.incident_id, item.sha256, item.object_name,
                          int(item.trusted), item.host, key_id, now, item.size))


def _new_stacks(sent: list[CheckedStacks], rank: int, version: int,
                held: list[StoredStacks]) -> list[tuple[StoredStacks, bytes]]:
    """The stacks of this request that ``version`` of the rank does not hold yet.

    The same bytes again are nothing new (idempotent); other bytes for a source the version holds
    are refused (409): the stacks of one dump were taken once, at that dump.
    """
    out: list[tuple[StoredStacks, bytes]] = []
    for item in sent:
        kept = next((h for h in held if h.version == version and h.source is item.source), None)
        if kept is not None:
            if kept.sha256 != item.sha256:
                raise ConflictError(f"rank {rank} version {version} already holds {item.source.value} stacks with "
                                    "other bytes; the stacks of one dump are taken once, and nothing was stored")
            continue
        out.append((StoredStacks(rank=rank, version=version, source=item.source, sha256=item.sha256,
                                 object_name=stacks_version_name(rank, version, item.source)), item.data))
    return out


def _version_for(earlier: list[StoredUpload], encoding: DumpEncoding, identity: UploadIdentity) -> int:
    """The version this upload belongs to.

    The pickle and the JSON of one dump are one version: an encoding the newest version lacks
    joins it when both describe the same moment (``dumped_at``). Anything else is a new version.
    """
    if not earlier:
        return 1
    newest = max(u.version for u in earlier)
    members = [u for u in earlier if u.version == newest]
    moment = identity.dumped_at.isoformat() if identity.dumped_at else None
    same_moment = all(_dumped_at(u) == moment for u in members)
    if moment is not None and same_moment and all(u.encoding is not encoding for u in members):
        return newest
    return newest + 1


def _dumped_at(upload: StoredUpload) -> str | None:
    ident = UploadIdentity.model_validate_json(upload.identity)
    return ident.dumped_at.isoformat() if ident.dumped_at else None


def _bound_to_host(caller: Caller, identity: UploadIdentity) -> UploadIdentity:
    """A node agent's key is bound to its host: it uploads that host's ranks only, so one
    compromised node cannot replace other nodes' dumps and pin the hang on them (403). An
    identity that names no host is that host's."""
    if caller.host is None:
        return identity
    if identity.host is None:
        return identity.model_copy(update={"host": caller.host})
    if identity.host != caller.host:
        raise ForbiddenError(f"this key is bound to host {caller.host!r}; it uploads that host's ranks only, "
                             f"not a rank on {identity.host!r}")
    return identity


def _check_rank_host(caller: Caller, identity: UploadIdentity, earlier: list[StoredUpload], *,
                     changes_rank: bool) -> None:
    """A host-bound key names its own host, so the rank number is what it could still lie about:
    it may not replace a rank that an earlier upload placed on another host (403); nor, when it
    would change the rank (a new version, stacks), one uploaded without a host (a job's key left
    it out: nothing shows the rank ran on this key's host, and a version's stacks are taken once)."""
    if caller.host is None:
        return
    for upload in earlier:
        host = json.loads(upload.identity).get("host")
        if host != caller.host and (host is not None or changes_rank):
            where = f"from host {host!r}" if host is not None else "without a host"
            raise ForbiddenError(f"rank {identity.rank} of this incident was uploaded {where}; a key "
                                 f"bound to host {caller.host!r} may not replace it or add to it")


def _check_rank_host_registered(caller: Caller, identity: UploadIdentity, registered_host: str | None) -> None:
    """As for earlier uploads: a rank that died without a dump never uploaded, so its registration
    is what says where it ran; another node's agent may not upload as that rank (403)."""
    if caller.host is not None and registered_host is not None and registered_host != caller.host:
        raise ForbiddenError(f"rank {identity.rank} of job {identity.job_id!r} is registered on host "
                             f"{registered_host!r}; a key bound to host {caller.host!r} may not upload it")


@contextmanager
def _all_or_nothing(what: str) -> Iterator[_Undo]:
    """Writes that are undone together when any of them, or their record, fails; a store or
    database failure is a 503 that says nothing was stored."""
    undo = _Undo()
    try:
        yield undo
    except BaseException as exc:
        undo.run()
        if isinstance(exc, (EvidenceError, sqlite3.Error)):
            raise StoreUnavailableError(f"{what} cannot be stored ({exc}); nothing was stored, "
                                        "retry the upload") from exc
        raise
