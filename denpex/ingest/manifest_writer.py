"""Each incident's ``manifest.json``, kept in memory and written to the store at most every interval.

Rewriting a 4,096-rank manifest on each of 4,096 uploads would write gigabytes (quadratic in the
ranks), so uploads update the in-memory manifest (O(1)) and mark it dirty; a writer thread writes
dirty manifests every ``interval_s``, and :meth:`ManifestWriter.close` writes what is left. The dumps
themselves are written before an upload is acknowledged; the manifest is derived from the
identities in the state database and is rebuilt from them after a restart, so a crash between an
acknowledgement and the next write loses nothing.

A job whose collectors registered its layout (:mod:`denpex.ingest.registration`) gives every
incident of that job its ranks first, so that a rank that died without a dump still has a host
(``host_source: registered``); uploads add to it and override it (``host_source: upload``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from denpex.evidence.errors import EvidenceError
from denpex.evidence.manifest import HostSource, JobManifest, ProcessGroupSpec, RankIdentity
from denpex.evidence.store import EvidenceStore
from denpex.ingest.identity import UploadIdentity
from denpex.ingest.incidents import IncidentBook, IncidentKey
from denpex.ingest.layout import incident_prefix
from denpex.ingest.registration import JobRegistry, RegisteredLayout

__all__ = ["ManifestWriter"]

_log = logging.getLogger(__name__)


@dataclass
class _Draft:
    """One incident's manifest as it grows."""

    job_id: str
    world_size: int = 0
    ranks: dict[int, RankIdentity] = field(default_factory=dict)
    groups: dict[str, ProcessGroupSpec] = field(default_factory=dict)
    registered: RegisteredLayout | None = None
    dirty: bool = True

    def add(self, identity: UploadIdentity) -> None:
        self.world_size = max(self.world_size, identity.world_size)
        self.ranks[identity.rank] = identity.rank_identity()
        for name, spec in identity.process_groups.items():
            self.groups.setdefault(name, spec)
        self.dirty = True

    def manifest(self, key: IncidentKey) -> JobManifest:
        layout = self.registered
        world_size = max(self.world_size, layout.world_size if layout else 0)
        ranks: dict[int, RankIdentity] = {}
        if layout is not None:
            for rank, entry in layout.ranks.items():
                if rank < world_size:
                    ranks[rank] = RankIdentity(**entry.model_dump(exclude_none=True),
                                               host_source=HostSource.REGISTERED if entry.host else None)
        for rank, uploaded in self.ranks.items():
            base = ranks.get(rank)
            given = uploaded.model_dump(exclude_none=True, exclude={"host_source", "moved"})
            if base is not None and uploaded.host is not None and base.host not in (None, uploaded.host):
                # Uploaded from another host than the registration's: the registered pid and GPU are
                # another process's, and must not be merged into this one.
                base = None
            merged = {**(base.model_dump(exclude_none=True) if base else {}), **given}
            if uploaded.host is not None:
                merged["host_source"] = HostSource.UPLOAD
            ranks[rank] = RankIdentity(**merged)
        if layout is not None:
            for rank, moves in layout.moves.items():
                if rank in ranks and rank < world_size:
                    ranks[rank] = ranks[rank].model_copy(update={"moved": tuple(moves)})
        groups = dict(self.groups)
        for name, spec in (layout.process_groups.items() if layout else ()):
            if all(r < world_size for r in spec.ranks):
                groups.setdefault(name, spec)
        return JobManifest(job_id=self.job_id, tenant=key.tenant, cluster=key.cluster, world_size=world_size,
                           ranks=dict(sorted(ranks.items())), process_groups=groups)


class ManifestWriter:
    """Keeps every touched incident's manifest and writes the changed ones periodically."""

    def __init__(self, store: EvidenceStore, book: IncidentBook, interval_s: float = 0.5,
                 jobs: JobRegistry | None = None) -> None:
        self._store = store
        self._book = book
        self._jobs = jobs
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._drafts: dict[IncidentKey, _Draft] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="denpex-manifest-writer", daemon=True)
        self._thread.start()

    # The lock guards the drafts only: every upload of every tenant takes it, so nothing that reads
    # the database (a layout, an incident's uploads) runs while it is held. Reads happen before,
    # and the result is swapped in.

    def add(self, key: IncidentKey, identity: UploadIdentity) -> None:
        """Record an accepted upload's identity (newest identity of a rank wins)."""
        with self._lock:
            draft = self._drafts.get(key)
            if draft is not None:
                draft.add(identity)
                return
        loaded = self._load(key, identity.job_id)  # includes this upload: it was recorded before
        with self._lock:
            draft = self._drafts.setdefault(key, loaded)
            draft.add(identity)

    def registered(self, tenant: str, cluster: str, job_id: str) -> None:
        """A registration of ``job_id`` changed its layout: its newest open incidents' manifests take
        it (ones this process has not touched yet too)."""
        if self._jobs is None:
            return
        keys = [IncidentKey(tenant, cluster, i) for i in self._book.incidents_of_job(tenant, cluster, job_id, limit=8)]
        for key in keys:
            with self._lock:
                known = key in self._drafts
            if known:
                layout = self._layout(key, job_id)
                with self._lock:
                    self._drafts[key].registered = layout
                    self._drafts[key].dirty = True
            else:
                loaded = self._load(key, job_id)
                with self._lock:
                    draft = self._drafts.setdefault(key, loaded)
                    if draft is not loaded:  # an upload loaded it meanwhile: take the newer layout
                        draft.registered = loaded.registered
                        draft.dirty = True

    def registered_host(self, key: IncidentKey, job_id: str, rank: int) -> str | None:
        """The host the job's registration placed ``rank`` on when the incident opened (now, for a
        new incident), or None."""
        if self._jobs is None:
            return None
        return self._jobs.host_at(key.tenant, key.cluster, job_id, rank, self._book.created_at(key))

    def opened(self, key: IncidentKey, job_id: str) -> None:
        """An incident opened without an upload (an alert): a registered layout still gives it a manifest."""
        if self._jobs is None:
            return
        with self._lock:
            if key in self._drafts:
                return
        draft = self._load(key, job_id)
        if draft.registered is None and not draft.ranks:
            return
        with self._lock:
            self._drafts.setdefault(key, draft)
        self.flush()  # the run starts now: its manifest must be there when it reads the evidence

    def flush(self) -> None:
        """Write every dirty manifest now; one the store refuses stays dirty for the next round."""
        with self._lock:  # copies only: the manifests are built outside the lock uploads take
            dirty = [(key, _Draft(job_id=d.job_id, world_size=d.world_size, ranks=dict(d.ranks),
                                  groups=dict(d.groups), registered=d.registered))
                     for key, d in self._drafts.items() if d.dirty]
            for key, _ in dirty:
                self._drafts[key].dirty = False
        pending = [(key, draft.job_id, draft.manifest(key)) for key, draft in dirty]
        for key, job_id, manifest in pending:
            name = f"{incident_prefix(key.tenant, key.cluster, job_id, key.incident_id)}/manifest.json"
            try:
                self._store.write(name, manifest.model_dump_json(exclude_none=True, indent=1).encode())
            except EvidenceError as exc:
                _log.warning("manifest of %s not written (%s); retrying", key.incident_id, exc)
                with self._lock:
                    self._drafts[key].dirty = True

    def close(self) -> None:
        """Stop the writer thread after a last flush."""
        self._stop.set()
        self._thread.join(10)
        self.flush()

    def _load(self, key: IncidentKey, job_id: str) -> _Draft:
        """An incident seen before this process started: its identities come from the database."""
        draft = _Draft(job_id=job_id, registered=self._layout(key, job_id))
        for upload in self._book.uploads(key):
            draft.add(UploadIdentity.model_validate_json(upload.identity))
        return draft

    def _layout(self, key: IncidentKey, job_id: str) -> RegisteredLayout | None:
        """The job's registered layout as it stood when the incident opened."""
        if self._jobs is None:
            return None
        return self._jobs.placement_at(key.tenant, key.cluster, job_id, self._book.created_at(key))

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - the writer must outlive one bad round
                _log.exception("manifest flush failed; retrying")
