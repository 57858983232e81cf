"""The collector's upload path: every dump goes to the spool, then to the ingest service, signed.

    EvidenceUploader.start() -> registers this rank (``POST /v1/jobs/{job_id}/ranks``): its host
                                (the scheduler's node name), local rank, pid, GPU and groups, so that
                                the job's layout is known even if this rank dies without a dump
    HangDumper --after_dump--> EvidenceUploader.submit(record, request)
        -> registers again (the same identity costs nothing; a restart elsewhere is a recorded move)
        -> one spool entry per dump file (identity + bytes + NVML telemetry when present + the rank's
           stacks files, the collector's and the py-spy sidecar's, when present and within bounds)
        -> a delivery thread sends each entry with a signed request (``denpex.ingest.client``)
           2xx: acknowledged, removed     5xx / 429 / no answer: retried with backoff
           413 with telemetry: sent again at once without it (the incident holds all the telemetry
                this key may add; the dump matters more)
           other 4xx: refused for good, set aside in ``rejected/`` (a bad key is never retried)

A brief outage of the API or of S3 (the API answers 503) therefore loses nothing; what stays in
the spool is delivered by the next :class:`EvidenceUploader` over the same folder (a restarted rank).

Configuration from the environment (:meth:`UploadTarget.from_env`)::

    DENPEX_INGEST_URL  DENPEX_INGEST_KEY_ID  DENPEX_INGEST_SECRET  DENPEX_TENANT  DENPEX_CLUSTER
    DENPEX_JOB_ID (default: the scheduler's, SLURM_JOB_ID or KUBERNETES_JOB_NAME, so the alert and
    the registration name one job)
"""

from __future__ import annotations

import io
import logging
import os
import random
import socket
import threading
from collections.abc import Mapping
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, SecretStr

from denpex.collector.dump_signal import DumpRequest
from denpex.collector.layout import stacks_path
from denpex.collector.scheduler_env import node_name, scheduler_job_id
from denpex.collector.spool import Spool, SpoolEntry
from denpex.evidence.dump_record import DumpRecord
from denpex.evidence.stacks import MAX_BYTES as MAX_STACKS_BYTES
from denpex.evidence.stacks import RankStacks, StackSource
from denpex.ingest.client import IngestClient

__all__ = ["UploadTarget", "Backoff", "service_busy", "EvidenceUploader", "incident_id_for", "torch_identity", "nvml_snapshot",
           "registration_body", "stacks_parts"]

_log = logging.getLogger(__name__)
_ENV = {"url": "DENPEX_INGEST_URL", "key_id": "DENPEX_INGEST_KEY_ID", "secret": "DENPEX_INGEST_SECRET",
        "tenant": "DENPEX_TENANT", "cluster": "DENPEX_CLUSTER", "job_id": "DENPEX_JOB_ID"}


class UploadTarget(BaseModel):
    """Where and as whom a rank uploads."""

    model_config = ConfigDict(frozen=True)

    url: str
    key_id: str
    secret: SecretStr
    tenant: str
    cluster: str
    job_id: str

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> UploadTarget | None:
        """The target from ``DENPEX_INGEST_*``; None when uploads are not configured (no URL)."""
        env = dict(os.environ if environ is None else environ)
        if not env.get(_ENV["url"]):
            return None
        job_id = scheduler_job_id(env)
        if job_id:
            env[_ENV["job_id"]] = job_id
        missing = [name for name in _ENV.values() if not env.get(name)]
        if missing:
            raise ValueError(f"uploads are configured ({_ENV['url']} is set) but {', '.join(missing)} "
                             "is not; set them all, or unset the URL")
        return cls.model_validate({field: env[name] for field, name in _ENV.items()})


class Backoff(BaseModel):
    """Retry delays: ``first_s`` doubling up to ``max_s``, with jitter so ranks do not retry in step."""

    model_config = ConfigDict(frozen=True)

    first_s: float = 0.5
    max_s: float = 30.0
    jitter: float = 0.3

    def delay(self, attempt: int) -> float:
        base = min(self.max_s, self.first_s * 2 ** max(0, attempt))
        return base * (1 - self.jitter + 2 * self.jitter * random.random())


def service_busy(status: int) -> bool:
    """Whether an answer with ``status`` may pass if sent again later: the service is busy (429, a
    5xx), or 408, the body arrived slower than it allows (a busy link; another try may be faster).
    Any other refusal (401/403/409/413/422) cannot pass as sent, nor can 501 or 505: a server that
    does not implement the method or the HTTP version will not by the next try."""
    return status in (408, 429) or (status >= 500 and status not in _NEVER_LATER)


_NEVER_LATER = frozenset({501, 505})


def incident_id_for(request: DumpRequest) -> str:
    """The incident id every rank derives from the one shared dump request.

    >>> from datetime import datetime
    >>> incident_id_for(DumpRequest(requested_by="rank 2", reason="x",
    ...                             requested_at=datetime(2026, 12, 1, 13, 9, 14, 250000, tzinfo=UTC)))
    'fr-20261201T130914.250Z'
    """
    at = request.requested_at.astimezone(UTC)
    return f"fr-{at.strftime('%Y%m%dT%H%M%S')}.{at.microsecond // 1000:03d}Z"


def torch_identity(job_id: str, incident_id: str) -> dict[str, Any]:
    """Rank, world size and process groups from ``torch.distributed``; host (the scheduler's node
    name), local rank, pid and the current GPU."""
    from denpex.collector.job_identity import read_job_identity

    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_process_group_name, _world

    groups: dict[str, Any] = {}
    for group in list(_world.pg_names):
        try:
            groups[_get_process_group_name(group)] = {"desc": getattr(group, "group_desc", None),
                                                      "ranks": dist.get_process_group_ranks(group)}
        except (RuntimeError, ValueError, KeyError):
            continue  # a group being torn down
    local_rank = os.environ.get("LOCAL_RANK")
    gpu = read_job_identity()
    return {"job_id": job_id, "incident_id": incident_id, "rank": dist.get_rank(),
            "world_size": dist.get_world_size(), "host": node_name(),
            "local_rank": int(local_rank) if local_rank and local_rank.isdigit() else None, "pid": os.getpid(),
            "gpu_uuid": gpu.gpu_uuid, "gpu_pci_bus_id": gpu.gpu_pci_bus_id, "process_groups": groups}


_REGISTERED_FIELDS = ("host", "local_rank", "pid", "gpu_uuid", "gpu_pci_bus_id")


def registration_body(identity: Mapping[str, Any]) -> dict[str, Any] | None:
    """One rank's registration from its upload identity; None when it lacks the rank or world size.

    >>> registration_body({"rank": 1, "world_size": 4, "host": "gpu-node-002", "pid": 7, "dumped_at": "x"})
    {'world_size': 4, 'ranks': {'1': {'host': 'gpu-node-002', 'pid': 7}}, 'process_groups': {}}
    """
    rank, world_size = identity.get("rank"), identity.get("world_size")
    if not isinstance(rank, int) or not isinstance(world_size, int):
        return None
    entry = {k: identity[k] for k in _REGISTERED_FIELDS if identity.get(k) is not None}
    return {"world_size": world_size, "ranks": {str(rank): entry},
            "process_groups": dict(identity.get("process_groups") or {})}


def nvml_snapshot(host: str) -> bytes | None:
    """One NVML snapshot as ``collect-telemetry`` JSON lines, or None where there is no NVML or GPU."""
    from denpex.hardware.errors import HardwareError
    from denpex.hardware.nvml_collector import collect_telemetry, load_pynvml

    out = io.StringIO()
    try:
        collect_telemetry(out, duration_s=0, host=host, nvml=load_pynvml(), poll_s=0.1)
    except (HardwareError, OSError) as exc:
        _log.info("no NVML telemetry attached: %s", exc)
        return None
    return out.getvalue().encode()


_STACKS_PARTS = {StackSource.COLLECTOR: "stacks", StackSource.PY_SPY: "stacks_pyspy"}


def stacks_parts(dump_dir: Path, rank: int) -> dict[str, bytes]:
    """The rank's stacks files under ``dump_dir`` as upload parts (part name -> bytes).

    Only a file the service will take goes: within the byte limit, a valid record of this rank and
    of the source its name says. Anything else is left out (logged): the service would refuse the
    whole upload for it, and a stacks file must never cost the dump.
    """
    parts: dict[str, bytes] = {}
    for source, part in _STACKS_PARTS.items():
        path = stacks_path(dump_dir, rank, source)
        try:
            with path.open("rb") as fh:
                data = fh.read(MAX_STACKS_BYTES + 1)
        except FileNotFoundError:
            continue
        except OSError as exc:
            _log.warning("rank %d: %s cannot be read (%s); uploading without it", rank, path.name, exc)
            continue
        if len(data) > MAX_STACKS_BYTES:
            _log.warning("rank %d: %s is over %d bytes; uploading without it", rank, path.name, MAX_STACKS_BYTES)
            continue
        try:
            record = RankStacks.model_validate_json(data)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            _log.warning("rank %d: %s is not a valid stacks record (%s); uploading without it", rank, path.name,
                         str(exc)[:200])
            continue
        if record.rank != rank or record.source is not source:
            _log.warning("rank %d: %s holds rank %d from %s; uploading without it", rank, path.name, record.rank,
                         record.source.value)
            continue
        parts[part] = data
    return parts


class EvidenceUploader:
    """Spools a rank's dumps and delivers them in a background thread until acknowledged."""

    def __init__(self, target: UploadTarget, *, dump_dir: Path, spool_dir: Path,
                 identity: Mapping[str, Any] | None = None,
                 backoff: Backoff | None = None, attach_nvml: bool = True, http: httpx.Client | None = None) -> None:
        self.target = target
        self.dump_dir = dump_dir
        self.spool = Spool(spool_dir)
        self._identity = dict(identity or {})
        self._backoff = backoff or Backoff()
        self._attach_nvml = attach_nvml
        self._client = IngestClient(target.url, key_id=target.key_id, secret=target.secret, tenant=target.tenant,
                                    cluster=target.cluster, timeout_s=20.0, http=http)
        self._delivering = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0
        self._registration: dict[str, Any] | None = None
        """A registration the service has not acknowledged yet (retried by the delivery thread)."""
        self.registered = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> EvidenceUploader:
        """Register this rank, then start delivering (what is already spooled is delivered too).

        The registration is tried once here, so that the job's layout is known from its first
        step; when the service cannot take it now, the delivery thread retries it."""
        if self._thread is not None:
            raise RuntimeError("this uploader is already started")
        self.register()
        self._thread = threading.Thread(target=self._run, name="denpex-evidence-uploader", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: timedelta = timedelta(seconds=5)) -> None:
        """Stop the delivery thread; undelivered entries stay in the spool."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout.total_seconds())

    # -- registration ------------------------------------------------------------------------

    def register(self, identity: Mapping[str, Any] | None = None) -> bool:
        """Register this rank's identity (``identity``, else the one given or torch's); True once
        the service acknowledged it. Never raises: a registration must not disturb the job."""
        base = dict(identity) if identity is not None else (
            self._identity or _torch_identity_or_empty(self.target.job_id, ""))
        body = registration_body(base)
        if body is None:
            _log.info("not registering: the identity names no rank or world size")
            return False
        self._registration = body
        return self._send_registration()

    def _send_registration(self) -> bool:
        body = self._registration
        if body is None:
            return True
        try:
            response = self._client.register(self.target.job_id, body)
        except httpx.HTTPError as exc:
            _log.warning("registration of job %s failed (%s); retrying", self.target.job_id, exc)
            return False
        if response.status_code < 300:
            self._registration = None
            self.registered += 1
            for move in response.json().get("moved", []):
                _log.warning("rank %s of job %s re-registered from %s to %s (a restart)", move.get("rank"),
                             self.target.job_id, move.get("from_host"), move.get("to_host"))
            return True
        if response.status_code >= 500 or response.status_code in (408, 429):
            _log.warning("registration: HTTP %d (%s); retrying later", response.status_code, response.text[:200])
            return False
        _log.error("registration of job %s refused for good: HTTP %d: %s", self.target.job_id,
                   response.status_code, response.text[:500])
        self._registration = None
        return True

    # -- spooling ----------------------------------------------------------------------------

    def submit(self, record: DumpRecord, request: DumpRequest) -> None:
        """The :class:`HangDumper` hook: spool every file of ``record``, then try to deliver it now.

        Spooled first, so that nothing is lost however the rank ends; delivered at once, because
        a launcher may tear the job down soon after a rank dumps. What fails here is retried by the
        delivery thread (or by the next uploader over this spool).
        """
        entries = self.spool_dump(record, request)
        if entries:
            self.register(entries[0].identity)
        self.deliver_once()

    def spool_dump(self, record: DumpRecord, request: DumpRequest) -> list[SpoolEntry]:
        """Spool every file of ``record`` and wake the delivery thread; return the entries."""
        identity = self._identity_for(record, incident_id_for(request))
        telemetry = [t for t in [nvml_snapshot(record.host or socket.gethostname())] if t] if self._attach_nvml else []
        stacks = stacks_parts(self.dump_dir, record.rank)
        entries = [self.spool.put(identity, self.dump_dir / name, telemetry, stacks) for name in record.files]
        self._wake.set()
        return entries

    def _identity_for(self, record: DumpRecord, incident_id: str) -> dict[str, Any]:
        identity: dict[str, Any] = {"job_id": self.target.job_id, "incident_id": incident_id, "rank": record.rank,
                                    "pid": record.pid, "dumped_at": record.dumped_at.isoformat()}
        if record.host:
            identity["host"] = record.host
        if record.local_rank is not None:
            identity["local_rank"] = record.local_rank
        if record.torch_version:
            identity["torch_version"] = record.torch_version
        # torch.distributed knows the world and the groups; a caller may pass them in instead.
        base = self._identity or _torch_identity_or_empty(self.target.job_id, incident_id)
        merged = {**base, **identity}
        return {k: v for k, v in merged.items() if v is not None}

    # -- delivery ----------------------------------------------------------------------------

    def deliver_once(self) -> bool:
        """Try every pending entry once, oldest first; True when the spool is empty afterwards."""
        # One deliverer at a time: the hook and the thread must not send one entry twice at once.
        with self._delivering:
            if not self._send_registration():
                return False
            for entry in self.spool.pending():
                if self._stop.is_set():
                    return False
                if not self._deliver(entry):
                    return False
            return not self.spool.pending()

    def _deliver(self, entry: SpoolEntry) -> bool:
        """False when the entry must be retried later (the service or the network is down)."""
        try:
            stacks = entry.stacks()
            telemetry = entry.telemetry()
            response = self._client.upload(entry.identity, entry.dump(), entry.dump_name, telemetry,
                                           stacks=stacks.get("stacks"), stacks_pyspy=stacks.get("stacks_pyspy"))
            if response.status_code == 413 and telemetry:
                # The incident holds all the telemetry this job's key may add (a large job's every rank
                # sends its NVML snapshot); the dump matters more than telemetry that is only shown.
                _log.warning("upload of %s: the service refused its telemetry (%s); sending the dump without it",
                             entry.path.name, response.text[:200])
                response = self._client.upload(entry.identity, entry.dump(), entry.dump_name, [],
                                               stacks=stacks.get("stacks"), stacks_pyspy=stacks.get("stacks_pyspy"))
        except httpx.HTTPError as exc:
            _log.warning("upload of %s failed (%s); it stays in the spool", entry.path.name, exc)
            return False
        if response.status_code < 300:
            self.spool.done(entry)
            self.delivered += 1
            return True
        if service_busy(response.status_code):
            _log.warning("upload of %s: HTTP %d (%s); retrying later", entry.path.name, response.status_code,
                         response.text[:200])
            return False
        # 401/403/409/413/422: retrying the same request cannot succeed; keep it for a person.
        reason = f"HTTP {response.status_code}: {response.text[:500]}"
        _log.error("upload of %s refused for good: %s", entry.path.name, reason)
        self.spool.reject(entry, reason)
        return True

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            try:
                emptied = self.deliver_once()
            except Exception:  # noqa: BLE001 - the uploader must never take the training down
                _log.exception("the evidence uploader failed; retrying")
                emptied = False
            if emptied:
                attempt = 0
                self._wake.wait()
                self._wake.clear()
                continue
            self._stop.wait(self._backoff.delay(attempt))
            attempt += 1


def _torch_identity_or_empty(job_id: str, incident_id: str) -> dict[str, Any]:
    try:
        return torch_identity(job_id, incident_id)
    except (ImportError, RuntimeError, ValueError) as exc:
        _log.warning("no identity from torch.distributed (%s); uploading without world size", exc)
        return {}
