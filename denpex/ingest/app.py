"""The HTTP app (FastAPI): ``POST /v1/evidence``, ``POST /v1/alerts``, ``GET /v1/incidents/{id}``,
``POST|GET /v1/jobs/{job_id}/ranks``.

Thin: check what the headers alone can tell, receive the body (:mod:`denpex.ingest.request_body`:
a v2 signature is verified from the headers before anything is reserved, a v1 one once its body
arrived within a small allowance), parse, call the service, answer JSON. No body byte is read
before the headers pass (a stranger is answered 401 or 403 at once), and no body is ever held
whole in memory. Every refusal is
``{"error": "<one clear sentence>"}`` with the status of its :class:`IngestError`. Blocking work
(SQLite, the store, the dump check, the multipart parse) runs in the thread pool, never on the
event loop.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from denpex.ingest.alerts import Alert, alert_from_watchdog, parse_alertmanager, parse_denpex_alert
from denpex.ingest.auth import authenticate_bearer
from denpex.ingest.body_spool import SpooledFile, SpoolBusyError
from denpex.ingest.coverage import incident_view
from denpex.ingest.errors import IngestError, InvalidRequestError, NotFoundError, RateLimitedError
from denpex.ingest.identity import ID_PATTERN, parse_identity, parse_telemetry_identity
from denpex.ingest.incidents import IncidentKey
from denpex.ingest.registration import parse_registration
from denpex.ingest.request_body import SignedReceiver
from denpex.ingest.service import IngestService
from denpex.ingest.upload_form import FormCaps, parse_upload_form

__all__ = ["create_app"]


def create_app(service: IngestService) -> FastAPI:
    """The app over ``service``; the service's workers stop with the app."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

    app = FastAPI(title="Denpex ingest", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    receiver = SignedReceiver(service.registry, service.nonces, service.spool)

    @app.exception_handler(IngestError)
    async def _refused(_: Request, exc: IngestError) -> JSONResponse:
        retry_after = exc.retry_after_s if isinstance(exc, (RateLimitedError, SpoolBusyError)) else None
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return JSONResponse({"error": str(exc)}, status_code=exc.status, headers=headers)

    @app.exception_handler(Exception)
    async def _crashed(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": f"internal error ({type(exc).__name__}); nothing was acknowledged, retry"},
                            status_code=500)

    @app.get("/healthz")
    async def health() -> JSONResponse:
        return JSONResponse({"ok": True})

    @app.post("/v1/evidence")
    async def upload_evidence(request: Request) -> JSONResponse:
        pending = await receiver.check_headers(request, service.clock())
        content_type = request.headers.get("content-type", "")
        if not content_type.lower().startswith("multipart/form-data"):
            raise InvalidRequestError("an upload is multipart/form-data with the parts 'identity' and 'dump' "
                                      "(or, from a node agent's key, 'identity' and 'telemetry')")
        caps = FormCaps(max_dump_bytes=service.config.max_dump_bytes,
                        max_telemetry_bytes=service.config.max_telemetry_bytes)
        async with receiver.body(request, pending, cap=service.config.max_upload_bytes, now=service.clock()) as got:
            caller = got.caller
            form = await run_in_threadpool(parse_upload_form, got.body.path, content_type, got.slot, caps)
            if form.dump is None:
                # A node agent's telemetry without a dump (the rank on its host died without one).
                telemetry_identity = parse_telemetry_identity(form.identity)
                sent = await run_in_threadpool(service.evidence.accept_telemetry, caller, telemetry_identity,
                                               form.telemetry)
                return JSONResponse(sent.model_dump(), status_code=201 if sent.stored else 200)
            identity = parse_identity(form.identity)
            receipt = await run_in_threadpool(service.evidence.accept, caller, identity, form.dump, form.telemetry,
                                              form.stacks)
        return JSONResponse(receipt.model_dump(), status_code=201 if receipt.stored else 200)

    @app.post("/v1/alerts")
    async def receive_alert(request: Request) -> JSONResponse:
        cap = service.config.max_alert_bytes
        now = datetime.fromtimestamp(service.clock(), UTC)
        authorization = request.headers.get("authorization")
        if authorization is not None:
            # The token is checked from the headers: only then is anything reserved, in the bearer pool.
            grant = await run_in_threadpool(authenticate_bearer, service.registry, authorization)
            tenant, cluster = grant.tenant, grant.cluster
            async with receiver.bearer_body(request, tenant, cluster, cap=cap) as spooled:
                body = await _small_body(spooled)
            alerts = parse_alertmanager(body, tenant=tenant, cluster=cluster, received_at=now)
        else:
            pending = await receiver.check_headers(request, service.clock())
            async with receiver.body(request, pending, cap=cap, now=service.clock()) as got:
                body = await _small_body(got.body)
            tenant, cluster = got.caller.tenant, got.caller.cluster
            alerts = _signed_alerts(request, body, now)
        receipts = await run_in_threadpool(service.alerts.receive, tenant, cluster, alerts)
        return JSONResponse({"alerts": [r.model_dump(mode="json") for r in receipts]})

    @app.post("/v1/jobs/{job_id}/ranks")
    async def register_ranks(job_id: str, request: Request) -> JSONResponse:
        pending = await receiver.check_headers(request, service.clock())
        _check_job_id(job_id)
        async with receiver.body(request, pending, cap=service.config.max_registration_bytes,
                                 now=service.clock()) as got:
            body = await _small_body(got.body)
        caller = got.caller
        registration = await run_in_threadpool(parse_registration, body)  # up to 8 MiB: off the event loop
        receipt = await run_in_threadpool(service.jobs.register, caller, job_id, registration)
        if receipt.changed:
            await run_in_threadpool(service.manifests.registered, caller.tenant, caller.cluster, job_id)
        return JSONResponse(receipt.model_dump(mode="json"), status_code=201 if receipt.changed else 200)

    @app.get("/v1/jobs/{job_id}/ranks")
    async def read_ranks(job_id: str, request: Request) -> JSONResponse:
        pending = await receiver.check_headers(request, service.clock())
        caller = await receiver.empty(request, pending, service.clock())
        _check_job_id(job_id)
        layout = await run_in_threadpool(service.jobs.layout, caller.tenant, caller.cluster, job_id)
        if layout is None:
            raise NotFoundError(f"no registered job {job_id!r} for tenant {caller.tenant!r}, cluster "
                                f"{caller.cluster!r}")
        return JSONResponse({"job_id": job_id, **layout.model_dump(mode="json", exclude_none=True)})

    @app.get("/v1/incidents/{incident_id}")
    async def read_incident(incident_id: str, request: Request) -> JSONResponse:
        # A GET signs the empty body; whatever body a sender attaches is never read.
        pending = await receiver.check_headers(request, service.clock())
        caller = await receiver.empty(request, pending, service.clock())
        key = IncidentKey(caller.tenant, caller.cluster, incident_id)
        view = await run_in_threadpool(incident_view, service.book, service.trigger, key)
        return JSONResponse(view.model_dump(mode="json"))

    return app


def _check_job_id(job_id: str) -> None:
    """A job id becomes part of storage keys: refused (422) before anything else is read."""
    if not re.fullmatch(ID_PATTERN, job_id):
        raise InvalidRequestError(f"job id {job_id[:64]!r} is not a valid id (letters, digits, '.', '_', '-'; "
                                  "at most 128)")


async def _small_body(spooled: SpooledFile) -> bytes:
    """A body already under a small cap (an alert's 4 MiB), read back from its spool file."""
    return await run_in_threadpool(spooled.path.read_bytes)


def _signed_alerts(request: Request, body: bytes, now: datetime) -> list[Alert]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "text/plain":
        params = request.query_params
        if "job_id" not in params:
            raise InvalidRequestError("a raw watchdog line needs the job: POST /v1/alerts?job_id=JOB"
                                      "[&incident_id=ID][&world_size=N]")
        world_size = params.get("world_size")
        if world_size is not None and not (world_size.isascii() and world_size.isdigit() and len(world_size) <= 9):
            raise InvalidRequestError(f"world_size {world_size!r} is not a positive integer")
        return [alert_from_watchdog(body.decode("utf-8", errors="replace"), job_id=params["job_id"],
                                    incident_id=params.get("incident_id"),
                                    world_size=int(world_size) if world_size else None, received_at=now)]
    return [parse_denpex_alert(body, received_at=now)]
