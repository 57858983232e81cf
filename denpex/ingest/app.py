"""The HTTP app (FastAPI): ``POST /v1/evidence``, ``POST /v1/alerts``, ``GET /v1/incidents/{id}``.

Thin: read the body under its cap, authenticate, parse, call the service, answer JSON. Every
refusal is ``{"error": "<one clear sentence>"}`` with the status of its :class:`IngestError`.
Blocking work (SQLite, the store, the dump check) runs in the thread pool, never on the event loop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from denpex.ingest.alerts import Alert, alert_from_watchdog, parse_alertmanager, parse_denpex_alert
from denpex.ingest.auth import Caller, authenticate_bearer, authenticate_signed
from denpex.ingest.coverage import incident_view
from denpex.ingest.errors import IngestError, InvalidRequestError, PayloadTooLargeError, RateLimitedError
from denpex.ingest.identity import parse_identity
from denpex.ingest.incidents import IncidentKey
from denpex.ingest.service import IngestService

__all__ = ["create_app"]

_MAX_PARTS = 34  # identity, dump, and up to 32 telemetry files


def create_app(service: IngestService) -> FastAPI:
    """The app over ``service``; the service's workers stop with the app."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

    app = FastAPI(title="Denpex ingest", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(IngestError)
    async def _refused(_: Request, exc: IngestError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, RateLimitedError) else None
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
        body = await _read_body(request, service.config.max_upload_bytes)
        caller = await _signed(service, request, body)
        identity, dump, filename, telemetry = await _parse_upload(service, request, body)
        receipt = await run_in_threadpool(service.evidence.accept, caller, identity, dump, filename, telemetry)
        return JSONResponse(receipt.model_dump(), status_code=201 if receipt.stored else 200)

    @app.post("/v1/alerts")
    async def receive_alert(request: Request) -> JSONResponse:
        body = await _read_body(request, service.config.max_alert_bytes)
        now = datetime.fromtimestamp(service.clock(), UTC)
        authorization = request.headers.get("authorization")
        if authorization is not None:
            grant = await run_in_threadpool(authenticate_bearer, service.registry, authorization)
            tenant, cluster = grant.tenant, grant.cluster
            alerts = parse_alertmanager(body, tenant=tenant, cluster=cluster, received_at=now)
        else:
            caller = await _signed(service, request, body)
            tenant, cluster = caller.tenant, caller.cluster
            alerts = _signed_alerts(request, body, now)
        receipts = await run_in_threadpool(service.alerts.receive, tenant, cluster, alerts)
        return JSONResponse({"alerts": [r.model_dump(mode="json") for r in receipts]})

    @app.get("/v1/incidents/{incident_id}")
    async def read_incident(incident_id: str, request: Request) -> JSONResponse:
        caller = await _signed(service, request, b"")
        key = IncidentKey(caller.tenant, caller.cluster, incident_id)
        view = await run_in_threadpool(incident_view, service.book, service.trigger, key)
        return JSONResponse(view.model_dump(mode="json"))

    return app


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole body, refused (413) as soon as it passes ``limit``: never read past the cap."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"the body is {int(declared):,} bytes, over the {limit:,}-byte cap; "
                                   "nothing was stored")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"the body is over the {limit:,}-byte cap; nothing was stored")
        chunks.append(chunk)
    return b"".join(chunks)


async def _signed(service: IngestService, request: Request, body: bytes) -> Caller:
    return await run_in_threadpool(authenticate_signed, service.registry, service.nonces, dict(request.headers),
                                   method=request.method, path=request.url.path, body=body, now=service.clock())


def _signed_alerts(request: Request, body: bytes, now: datetime) -> list[Alert]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "text/plain":
        params = request.query_params
        if "job_id" not in params:
            raise InvalidRequestError("a raw watchdog line needs the job: POST /v1/alerts?job_id=JOB"
                                      "[&incident_id=ID][&world_size=N]")
        world_size = params.get("world_size")
        if world_size is not None and not world_size.isdigit():
            raise InvalidRequestError(f"world_size {world_size!r} is not a positive integer")
        return [alert_from_watchdog(body.decode("utf-8", errors="replace"), job_id=params["job_id"],
                                    incident_id=params.get("incident_id"),
                                    world_size=int(world_size) if world_size else None, received_at=now)]
    return [parse_denpex_alert(body, received_at=now)]


async def _parse_upload(service: IngestService, request: Request,
                        body: bytes) -> tuple[Any, bytes, str, list[bytes]]:
    """identity, dump bytes, dump file name, telemetry files; every problem is a 413 or 422."""
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise InvalidRequestError("an upload is multipart/form-data with the parts 'identity' and 'dump'")
    # The body is already read (it had to be, to check the signature): let the form parser use it.
    request._body = body
    try:
        form = await request.form(max_files=_MAX_PARTS, max_fields=_MAX_PARTS, max_part_size=1024 * 1024)
    except Exception as exc:  # noqa: BLE001 - Starlette raises assorted errors for a bad multipart body
        raise InvalidRequestError(f"the multipart body cannot be parsed ({exc})") from exc
    try:
        identity_part = form.get("identity")
        dump_part = form.get("dump")
        if identity_part is None or not isinstance(dump_part, UploadFile):
            raise InvalidRequestError("an upload needs a part 'identity' (JSON) and a file part 'dump'")
        identity_raw = await identity_part.read() if isinstance(identity_part, UploadFile) else identity_part
        identity = parse_identity(identity_raw)
        dump = await dump_part.read()
        if len(dump) > service.config.max_dump_bytes:
            raise PayloadTooLargeError(f"the dump is {len(dump):,} bytes, over the {service.config.max_dump_bytes:,}"
                                       "-byte cap per dump; nothing was stored")
        telemetry = []
        for part in form.getlist("telemetry"):
            data = await part.read() if isinstance(part, UploadFile) else part.encode()
            if len(data) > service.config.max_telemetry_bytes:
                raise PayloadTooLargeError(f"a telemetry part is {len(data):,} bytes, over the "
                                           f"{service.config.max_telemetry_bytes:,}-byte cap; nothing was stored")
            telemetry.append(data)
        return identity, dump, dump_part.filename or "dump", telemetry
    finally:
        await form.close()
