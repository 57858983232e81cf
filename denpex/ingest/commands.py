"""The ingest commands of the ``denpex`` CLI: tenants, keys, tokens and ``serve-api``.

Thin: parse options, call the core, print, pick the exit code (0, or 2 with one line on stderr).
``denpex.cli`` registers them. State lives in ``$DENPEX_STATE_DIR`` (``--state-dir`` overrides).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from denpex.ingest.errors import RegistryError
from denpex.ingest.plans import PlanTier
from denpex.ingest.registry import Registry
from denpex.ingest.service import MAX_DUMP_BYTES
from denpex.state_dir import StateDirError, resolve_state_dir

__all__ = ["tenants_app", "keys_app", "tokens_app", "serve_api_command"]

EXIT_UNUSABLE = 2

tenants_app = typer.Typer(no_args_is_help=True, help="Manage the ingest service's tenants and their plans.")
keys_app = typer.Typer(no_args_is_help=True, help="Create and revoke request-signing keys.")
tokens_app = typer.Typer(no_args_is_help=True, help="Create Alertmanager bearer tokens.")

StateDirOption = Annotated[
    Path | None, typer.Option("--state-dir", help="State directory (default: $DENPEX_STATE_DIR).")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"denpex: error: {message}", err=True)
    return typer.Exit(EXIT_UNUSABLE)


def _registry(state_dir: Path | None) -> Registry:
    try:
        return Registry(resolve_state_dir(state_dir))
    except StateDirError as exc:
        raise _fail(str(exc)) from exc
    except OSError as exc:
        raise _fail(f"cannot open the state directory: {exc}") from exc


@tenants_app.command("add")
def tenants_add(
    tenant: Annotated[str, typer.Argument(metavar="TENANT")],
    plan: Annotated[PlanTier, typer.Option("--plan", help="The tenant's plan; only data-center may use hang triage.")],
    state_dir: StateDirOption = None,
) -> None:
    """Add a tenant (or change its plan)."""
    try:
        _registry(state_dir).add_tenant(tenant, plan)
    except RegistryError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(json.dumps({"tenant": tenant, "plan": plan.value}))


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant")],
    cluster: Annotated[str, typer.Option("--cluster")],
    host: Annotated[str | None, typer.Option("--host", help="Bind the key to one host (a node agent's "
                                                            "key); only such telemetry can support a drain.")] = None,
    state_dir: StateDirOption = None,
) -> None:
    """Create a signing key; prints {"key_id": ..., "secret": ...} once (the secret is not shown again)."""
    try:
        issued = _registry(state_dir).create_key(tenant, cluster, host)
    except RegistryError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(issued.model_dump_json(exclude_none=True))


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(metavar="KEY_ID")], state_dir: StateDirOption = None) -> None:
    """Revoke a key (rotate: create the new key, deploy it, then revoke the old one)."""
    try:
        _registry(state_dir).revoke_key(key_id)
    except RegistryError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(json.dumps({"key_id": key_id, "revoked": True}))


@tokens_app.command("create")
def tokens_create(
    tenant: Annotated[str, typer.Option("--tenant")],
    cluster: Annotated[str, typer.Option("--cluster")],
    state_dir: StateDirOption = None,
) -> None:
    """Create an Alertmanager bearer token bound to one tenant and cluster; printed once."""
    try:
        issued = _registry(state_dir).create_token(tenant, cluster)
    except RegistryError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(issued.model_dump_json())


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[str, typer.Argument(metavar="TOKEN_ID")],
                  state_dir: StateDirOption = None) -> None:
    """Revoke a bearer token by its id."""
    try:
        _registry(state_dir).revoke_token(token_id)
    except RegistryError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(json.dumps({"token_id": token_id, "revoked": True}))


def serve_api_command(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")] = 8080,
    store: Annotated[str | None, typer.Option("--store", metavar="URI", help="Where evidence goes: a folder or "
                                              "s3://bucket/prefix (default: $DENPEX_STATE_DIR/evidence).")] = None,
    prefect_api_url: Annotated[str | None, typer.Option(
        "--prefect-api-url", help="Prefect API that receives the alert event (default: $PREFECT_API_URL).")] = None,
    check_workers: Annotated[int, typer.Option("--check-workers", min=1,
                                               help="Worker processes that check dumps.")] = 2,
    max_dump_bytes: Annotated[int, typer.Option("--max-dump-bytes", min=1,
                                                help="Cap per dump (default 256 MiB).")] = MAX_DUMP_BYTES,
    state_dir: StateDirOption = None,
) -> None:
    """Run the ingest service: signed evidence uploads, alerts, incident coverage."""
    import uvicorn

    from denpex.ingest.app import create_app
    from denpex.ingest.service import IngestService, ServiceConfig

    try:
        resolved = resolve_state_dir(state_dir)
    except StateDirError as exc:
        raise _fail(str(exc)) from exc
    config = ServiceConfig(state_dir=resolved, store=store or str(resolved / "evidence"),
                           prefect_api_url=prefect_api_url or os.environ.get("PREFECT_API_URL"),
                           check_workers=check_workers, max_dump_bytes=max_dump_bytes)
    service = IngestService(config)
    uvicorn.run(create_app(service), host=host, port=port, log_level="info", access_log=False)
