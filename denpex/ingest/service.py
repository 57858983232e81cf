"""The ingest service's parts, wired once from its configuration (no global state).

``IngestService`` is what the HTTP app calls; tests and benchmarks can build one directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, SecretStr

from denpex.evidence.stacks import MAX_BYTES as MAX_STACKS_BYTES
from denpex.evidence.store import open_store
from denpex.ingest.alert_intake import AlertIntake, AlertLimits
from denpex.ingest.body_spool import BodySpool, SpoolLimits
from denpex.ingest.dump_check import DumpChecker
from denpex.ingest.evidence_intake import EvidenceIntake
from denpex.ingest.flow_trigger import FlowTrigger, NoEngineTrigger, PrefectEventTrigger
from denpex.ingest.incidents import IncidentBook
from denpex.ingest.manifest_writer import ManifestWriter
from denpex.ingest.nonce_cache import NonceCache
from denpex.ingest.registration import MAX_REGISTRATION_BYTES, JobRegistry
from denpex.ingest.registry import Registry
from denpex.ingest.upload_form import STACKS_PARTS

__all__ = ["MAX_DUMP_BYTES", "ServiceConfig", "IngestService"]

MAX_DUMP_BYTES = 256 * 1024 * 1024


class ServiceConfig(BaseModel):
    """Where state and evidence live, the caps, and the flow engine."""

    model_config = ConfigDict(frozen=True)

    state_dir: Path
    store: str
    prefect_api_url: str | None = None
    prefect_api_auth: SecretStr | None = None
    """``user:password`` for a Prefect API behind basic authentication (``PREFECT_API_AUTH_STRING``)."""
    max_dump_bytes: int = MAX_DUMP_BYTES
    max_telemetry_bytes: int = 64 * 1024 * 1024
    max_alert_bytes: int = 4 * 1024 * 1024
    max_registration_bytes: int = MAX_REGISTRATION_BYTES
    max_registrations_per_window: int = 20_000
    """Registrations one cluster may send per ``run_window_s`` (a 4,096-rank job registers each rank
    at start and again with each dump); more are answered 429."""
    max_registered_ranks_per_window: int = 1_000_000
    """Rank entries those registrations may carry in all, per cluster and window (429 past it)."""
    max_alerts_per_request: int = 256
    max_new_incidents_per_request: int = 16
    max_runs_per_window: int = 60
    """Incident runs one tenant's cluster may start per ``run_window_s``; more are answered 429."""
    run_window_s: float = 3600.0
    check_workers: int = 2
    manifest_interval_s: float = 0.5
    spool_dir: Path | None = None
    """Where request bodies are spooled while they are hashed (default: ``{state_dir}/spool``)."""
    max_bodies_in_flight: int = 64
    max_bodies_per_sender: int = 8
    max_spool_bytes: int = 4 << 30
    max_unverified_bytes: int | None = None
    """Spool bytes for v1-signed bodies before their signature is checked (default: a sixteenth of the
    spool, 256 MiB; one key id holds at most half, the largest v1 body taken); 0 refuses v1."""
    max_bearer_bytes: int | None = None
    """Spool bytes for Alertmanager bodies behind a checked token (default: a sixty-fourth, 64 MiB)."""
    max_spool_bytes_per_key: int | None = None
    """Spool bytes one key may hold in verified bodies (default: a quarter of the spool, 1 GiB)."""
    max_bodies_per_tenant: int | None = None
    """Verified bodies one tenant's keys may have arriving together (default: a quarter of
    ``max_bodies_in_flight``, 16)."""
    max_spool_bytes_per_tenant: int | None = None
    """Spool bytes one tenant's keys may hold together in verified bodies (default: what one key may)."""
    body_min_rate_bytes_s: int = 256 * 1024
    max_body_s: float = 900.0

    @property
    def spool_limits(self) -> SpoolLimits:
        """The bounds on bodies being received (:mod:`denpex.ingest.body_spool`)."""
        return SpoolLimits(directory=self.spool_dir or self.state_dir / "spool", max_in_flight=self.max_bodies_in_flight,
                           max_in_flight_per_source=self.max_bodies_per_sender,
                           max_disk_bytes=self.max_spool_bytes, max_unverified_bytes=self.max_unverified_bytes,
                           max_bearer_bytes=self.max_bearer_bytes, max_bytes_per_key=self.max_spool_bytes_per_key,
                           max_in_flight_per_tenant=self.max_bodies_per_tenant,
                           max_bytes_per_tenant=self.max_spool_bytes_per_tenant,
                           min_rate_bytes_s=self.body_min_rate_bytes_s, max_body_s=self.max_body_s)

    @property
    def max_upload_bytes(self) -> int:
        """The whole multipart body: a dump, its telemetry, its two stacks files and the identity, plus framing."""
        return self.max_dump_bytes + self.max_telemetry_bytes + len(STACKS_PARTS) * MAX_STACKS_BYTES + 1024 * 1024


class IngestService:
    """Registry, replay cache, body spool, job layouts, evidence and alert intake, over one state directory
    and one store."""

    def __init__(self, config: ServiceConfig, *, trigger: FlowTrigger | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.registry = Registry(config.state_dir)
        self.nonces = NonceCache(self.registry.db)
        self.book = IncidentBook(self.registry.db)
        store = open_store(config.store)
        self.checker = DumpChecker(config.check_workers)
        self.trigger: FlowTrigger = trigger or (
            PrefectEventTrigger(config.prefect_api_url, auth_string=_secret(config.prefect_api_auth))
            if config.prefect_api_url else NoEngineTrigger())
        self.jobs = JobRegistry(self.registry.db, max_per_window=config.max_registrations_per_window,
                                max_ranks_per_window=config.max_registered_ranks_per_window,
                                window_s=config.run_window_s, clock=clock)
        self.manifests = ManifestWriter(store, self.book, config.manifest_interval_s, jobs=self.jobs)
        self.evidence = EvidenceIntake(store, self.book, self.checker, self.manifests, self.registry.db,
                                       max_dump_bytes=config.max_dump_bytes)
        self.spool = BodySpool(config.spool_limits)
        limits = AlertLimits(max_alerts_per_request=config.max_alerts_per_request,
                             max_new_incidents_per_request=config.max_new_incidents_per_request,
                             max_runs_per_window=config.max_runs_per_window, window_s=config.run_window_s)
        self.alerts = AlertIntake(self.book, self.trigger, store.uri, limits=limits, clock=clock,
                                  on_opened=self.manifests.opened)

    def close(self) -> None:
        """Write the last manifests and stop the dump-checking workers."""
        self.manifests.close()
        self.checker.close()


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None
