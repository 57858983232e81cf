"""Accepting one rank's dump: check, hash, version, store, record, rebuild the manifest.

    checked identity + dump bytes
      -> safe loader in a worker process (422 when refused)
      -> sha256; the same bytes again for this rank -> {"stored": false} (idempotent)
      -> a new version (a pickle and its JSON of one moment share one), never an overwrite
      -> objects written: versions/..., rank_<r>.<ext>, telemetry/..., telemetry.json
      -> the database row, last: a store outage (503) leaves no row, and the retry lands in the
         same version's names with the same bytes
      -> manifest.json, from the identities, by :class:`ManifestWriter` (within its interval)
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from pydantic import BaseModel

from denpex.evidence.errors import EvidenceError
from denpex.evidence.fr_dump import DumpEncoding
from denpex.evidence.store import EvidenceStore
from denpex.hardware.stored_telemetry import TELEMETRY_INDEX, TelemetryIndex, TrustedFile
from denpex.ingest.auth import Caller
from denpex.ingest.dump_check import DumpChecker
from denpex.ingest.errors import InvalidRequestError, StoreUnavailableError
from denpex.ingest.identity import UploadIdentity
from denpex.ingest.incidents import IncidentBook, IncidentKey, StoredTelemetry, StoredUpload
from denpex.ingest.layout import (
    current_dump_name,
    incident_prefix,
    telemetry_name,
    version_name,
)
from denpex.ingest.manifest_writer import ManifestWriter

__all__ = ["UploadReceipt", "EvidenceIntake"]


class UploadReceipt(BaseModel):
    """The answer to an upload (ARCHITECTURE.md)."""

    stored: bool
    sha256: str
    version: int


@dataclass
class _Locks:
    """One lock per incident: versions of one rank are numbered one at a time."""

    guard: threading.Lock = field(default_factory=threading.Lock)
    by_incident: dict[IncidentKey, threading.Lock] = field(default_factory=lambda: defaultdict(threading.Lock))

    def of(self, key: IncidentKey) -> threading.Lock:
        with self.guard:
            return self.by_incident[key]


class EvidenceIntake:
    """Accepts uploads into one store, with bookkeeping in the state database."""

    def __init__(self, store: EvidenceStore, book: IncidentBook, checker: DumpChecker,
                 manifests: ManifestWriter) -> None:
        self.store = store
        self.book = book
        self.checker = checker
        self.manifests = manifests
        self._locks = _Locks()

    def accept(self, caller: Caller, identity: UploadIdentity, dump: bytes, filename: str,
               telemetry: list[bytes]) -> UploadReceipt:
        """Store one rank's dump (and telemetry) or refuse it; see the module docstring."""
        check = self.checker.check(dump, filename)
        sha256 = hashlib.sha256(dump).hexdigest()
        key = IncidentKey(caller.tenant, caller.cluster, identity.incident_id)
        with self._locks.of(key):
            self._check_job(key, identity)
            earlier = self.book.uploads(key, identity.rank)
            same = next((u for u in earlier if u.sha256 == sha256), None)
            if same is not None:
                return UploadReceipt(stored=False, sha256=sha256, version=same.version)
            version = _version_for(earlier, check.encoding, identity)
            upload = StoredUpload(rank=identity.rank, version=version, encoding=check.encoding, sha256=sha256,
                                  object_name=version_name(identity.rank, version, check.encoding),
                                  key_id=caller.key_id, identity=identity.model_dump_json(exclude_none=True),
                                  uploaded_at=time.time())
            items = [_telemetry_item(data, caller) for data in telemetry]
            joins = any(u.version == version for u in earlier)
            self._write(key, identity, upload, dump, telemetry, items, joins_version=joins)
            self.book.record_upload(key, identity.job_id, upload, identity.world_size, items)
            self.manifests.add(key, identity)
        return UploadReceipt(stored=True, sha256=sha256, version=version)

    def _check_job(self, key: IncidentKey, identity: UploadIdentity) -> None:
        record = self.book.record(key)
        if record is not None and record.job_id != identity.job_id:
            raise InvalidRequestError(f"incident {key.incident_id!r} belongs to job {record.job_id!r}, not "
                                      f"{identity.job_id!r}; each hang of each job has its own incident id")

    def _write(self, key: IncidentKey, identity: UploadIdentity, upload: StoredUpload, dump: bytes,
               telemetry: list[bytes], items: list[StoredTelemetry], *, joins_version: bool) -> None:
        base = incident_prefix(key.tenant, key.cluster, identity.job_id, key.incident_id)
        known = self.book.telemetry(key)
        every = {t.object_name: t for t in known + items}
        index = TelemetryIndex(
            trusted=[TrustedFile(name=name, host=t.host) for name, t in sorted(every.items()) if t.trusted and t.host],
            untrusted=[name for name, t in sorted(every.items()) if not t.trusted])
        try:
            # The immutable version first: whatever fails later, it is never lost or overwritten.
            self.store.write(f"{base}/{upload.object_name}", dump)
            for data, item in zip(telemetry, items):
                self.store.write(f"{base}/{item.object_name}", data)
            self.store.write(f"{base}/{current_dump_name(upload.rank, upload.encoding)}", dump)
            if upload.version > 1 and not joins_version:
                # The other encoding of the previous version must not stand beside this one:
                # triage would read the old pickle over a new JSON.
                other = DumpEncoding.JSON if upload.encoding is DumpEncoding.PICKLE else DumpEncoding.PICKLE
                self.store.delete(f"{base}/{current_dump_name(upload.rank, other)}")
            if items or known:
                self.store.write(f"{base}/{TELEMETRY_INDEX}", index.model_dump_json(indent=1).encode())
        except EvidenceError as exc:
            raise StoreUnavailableError(f"the evidence store cannot be written ({exc}); nothing was "
                                        "acknowledged, retry the upload") from exc

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


def _telemetry_item(data: bytes, caller: Caller) -> StoredTelemetry:
    """Telemetry is trusted only from a key bound to a host (a node agent's key)."""
    sha256 = hashlib.sha256(data).hexdigest()
    return StoredTelemetry(sha256=sha256, object_name=telemetry_name(sha256, caller.host),
                           trusted=caller.host is not None, host=caller.host)
