"""The ingest commands of the ``denpex`` CLI: tenants, clusters, keys, tokens and ``serve-api``.

Thin: parse options, call the core (``denpex.ingest``), print, pick the exit code (0, or 2 with one
line on stderr). ``denpex.cli`` registers them. State lives in ``$DENPEX_STATE_DIR`` (``--state-dir`` overrides).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from pydantic import SecretStr

from denpex.cli.exits import fail
from denpex.ingest.errors import RegistryError
from denpex.ingest.plans import PlanTier
from denpex.ingest.registry import Registry
from denpex.ingest.service import MAX_DUMP_BYTES
from denpex.state_dir import StateDirError, resolve_state_dir

__all__ = ["tenants_app", "clusters_app", "keys_app", "tokens_app", "serve_api_command"]

tenants_app = typer.Typer(no_args_is_help=True, help="Manage the ingest service's tenants and their plans.")
clusters_app = typer.Typer(no_args_is_help=True, help="Which tenant owns each cluster (one tenant per cluster).")
keys_app = typer.Typer(no_args_is_help=True, help="Create and revoke request-signing keys.")
tokens_app = typer.Typer(no_args_is_help=True, help="Create Alertmanager bearer tokens.")

StateDirOption = Annotated[
    Path | None, typer.Option("--state-dir", help="State directory (default: $DENPEX_STATE_DIR).")]


def _registry(state_dir: Path | None) -> Registry:
    try:
        return Registry(resolve_state_dir(state_dir))
    except StateDirError as exc:
        raise fail(str(exc)) from exc
    except OSError as exc:
        raise fail(f"cannot open the state directory: {exc}") from exc


@tenants_app.command("add")
def tenants_add(
    tenant: Annotated[str, typer.Argument(metavar="TENANT")],
    plan: Annotated[PlanTier, typer.Option("--plan", help="The tenant's plan; only data-center may use hang triage.")],
    state_dir: StateDirOption = None,
) -> None:
    """Add a tenant (or change its plan).

    Example:

    \b
    denpex tenants add acme --plan team
    """
    try:
        _registry(state_dir).add_tenant(tenant, plan)
    except RegistryError as exc:
        raise fail(str(exc)) from exc
    typer.echo(json.dumps({"tenant": tenant, "plan": plan.value}))


@clusters_app.command("add")
def clusters_add(
    cluster: Annotated[str, typer.Argument(metavar="CLUSTER")],
    tenant: Annotated[str, typer.Option("--tenant")],
    state_dir: StateDirOption = None,
) -> None:
    """Claim a cluster for a tenant (its first key or token does it too); a taken or colliding name is refused.

    Example:

    \b
    denpex clusters add gpu-prod --tenant acme
    """
    try:
        record = _registry(state_dir).add_cluster(tenant, cluster)
    except RegistryError as exc:
        raise fail(str(exc)) from exc
    typer.echo(record.model_dump_json())


@clusters_app.command("list")
def clusters_list(state_dir: StateDirOption = None) -> None:
    """Every registered cluster and its owner, one JSON object a line (opening the registry migrates it).

    Example:

    \b
    denpex clusters list
    """
    for record in _registry(state_dir).clusters():
        typer.echo(record.model_dump_json(exclude_none=True))


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant")],
    cluster: Annotated[str, typer.Option("--cluster")],
    host: Annotated[str | None, typer.Option("--host", help="Bind the key to one host (a node agent's "
                                                            "key); only such telemetry can support a drain.")] = None,
    state_dir: StateDirOption = None,
) -> None:
    """Create a signing key; prints {"key_id": ..., "secret": ...} once (the secret is not shown again).

    Example:

    \b
    denpex keys create --tenant acme --cluster gpu-prod
    """
    try:
        issued = _registry(state_dir).create_key(tenant, cluster, host)
    except RegistryError as exc:
        raise fail(str(exc)) from exc
    typer.echo(issued.model_dump_json(exclude_none=True))


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(metavar="KEY_ID")], state_dir: StateDirOption = None) -> None:
    """Revoke a key (rotate: create the new key, deploy it, then revoke the old one).

    Example:

    \b
    denpex keys revoke dk_3f9a1c0b2d4e6f80
    """
    try:
        _registry(state_dir).revoke_key(key_id)
    except RegistryError as exc:
        raise fail(str(exc)) from exc
    typer.echo(json.dumps({"key_id": key_id, "revoked": True}))


@tokens_app.command("create")
def tokens_create(
    tenant: Annotated[str, typer.Option("--tenant")],
    cluster: Annotated[str, typer.Option("--cluster")],
    state_dir: StateDirOption = None,
) -> None:
    """Create an Alertmanager bearer token bound to one tenant and cluster; printed once.

    Example:

    \b
    denpex tokens create --tenant acme --cluster gpu-prod
    """
    try:
        issued = _registry(state_dir).create_token(tenant, cluster)
    except RegistryError as exc:
        raise fail(str(exc)) from exc
    typer.echo(issued.model_dump_json())


@tokens_app.command("revoke")
def tokens_revoke(token_id: Annotated[str, typer.Argument(metavar="TOKEN_ID")],
                  state_dir: StateDirOption = None) -> None:
    """Revoke a bearer token by its id.

    Example:

    \b
    denpex tokens revoke dt_81be07c4a9d2e513
    """
    try:
        _registry(state_dir).revoke_token(token_id)
    except RegistryError as exc:
        raise fail(str(exc)) from exc
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
    spool_dir: Annotated[Path | None, typer.Option(
        "--spool-dir", help="Where request bodies are spooled while hashed (default: STATE_DIR/spool).")] = None,
    max_bodies_in_flight: Annotated[int, typer.Option(
        "--max-bodies-in-flight", min=1, help="Bodies received at once; more are answered 503 with Retry-After.")] = 64,
    max_bodies_per_sender: Annotated[int, typer.Option(
        "--max-bodies-per-sender", min=1, help="Bodies one key (or bearer token) may have arriving at once; "
                                               "more are answered 503 with Retry-After.")] = 8,
    max_spool_bytes: Annotated[int, typer.Option(
        "--max-spool-bytes", min=1, help="Disk the spooled bodies may take (default 4 GiB); past it, 503.")] = 4 << 30,
    max_unverified_bytes: Annotated[int | None, typer.Option(
        "--max-unverified-bytes", min=0, help="Of the spool, what v1-signed bodies may hold before their signature "
                                              "is checked (default: a sixteenth); one key id holds at most half, "
                                              "the largest v1 body taken; 0 refuses v1.")] = None,
    max_bearer_bytes: Annotated[int | None, typer.Option(
        "--max-bearer-bytes", min=1, help="Of the spool, what Alertmanager bodies may hold once their token checked "
                                          "out (default: a sixty-fourth).")] = None,
    max_spool_bytes_per_key: Annotated[int | None, typer.Option(
        "--max-spool-bytes-per-key", min=1, help="What one key's verified bodies may hold of the spool (default: a "
                                                 "quarter); past it, 503 with Retry-After.")] = None,
    max_bodies_per_tenant: Annotated[int | None, typer.Option(
        "--max-bodies-per-tenant", min=1, help="Verified bodies one tenant's keys may have arriving together "
                                               "(default: a quarter of --max-bodies-in-flight); more are answered "
                                               "503 with Retry-After.")] = None,
    max_spool_bytes_per_tenant: Annotated[int | None, typer.Option(
        "--max-spool-bytes-per-tenant", min=1, help="What one tenant's keys together may hold of the spool in "
                                                    "verified bodies (default: what one key may); past it, 503.")] = None,
    body_min_rate: Annotated[int, typer.Option(
        "--body-min-rate", min=1, help="Bytes/s a body must keep (plus 30 s of grace) before it is cut off "
                                       "with 408 (default 256 KiB/s).")] = 256 * 1024,
    max_body_seconds: Annotated[float, typer.Option(
        "--max-body-seconds", min=0.1, help="The most seconds any body may take to arrive (default 900).")] = 900.0,
    max_runs_per_window: Annotated[int, typer.Option(
        "--max-runs-per-window", min=1, help="Incident runs one tenant's cluster may start per window; more "
                                             "alerts are answered 429 and recorded (default 60).")] = 60,
    run_window_seconds: Annotated[float, typer.Option(
        "--run-window-seconds", min=1, help="The window of --max-runs-per-window (default 3600).")] = 3600.0,
    max_connections: Annotated[int, typer.Option(
        "--max-connections", min=1, help="Connections served at once; more are answered 503 (default 1024).")] = 1024,
    max_connections_per_address: Annotated[int, typer.Option(
        "--max-connections-per-address", min=1,
        help="Connections one client address (an IPv6 /64) may hold at once; more are answered 503 "
             "(default 256; behind a proxy or NAT every client shares its address).")] = 256,
    state_dir: StateDirOption = None,
) -> None:
    """Run the ingest service: signed evidence uploads, alerts, incident coverage.

    Example:

    \b
    DENPEX_STATE_DIR=/var/lib/denpex denpex serve-api --port 8088 --store s3://denpex-evidence/
    """
    from denpex.http_serving import serve
    from denpex.ingest.app import create_app
    from denpex.ingest.service import IngestService, ServiceConfig

    try:
        resolved = resolve_state_dir(state_dir)
    except StateDirError as exc:
        raise fail(str(exc)) from exc
    config = ServiceConfig(state_dir=resolved, store=store or str(resolved / "evidence"),
                           prefect_api_url=prefect_api_url or os.environ.get("PREFECT_API_URL"),
                           # Read from the environment only, never an option: it would show in `ps`.
                           prefect_api_auth=_auth_string(os.environ.get("PREFECT_API_AUTH_STRING")),
                           check_workers=check_workers, max_dump_bytes=max_dump_bytes, spool_dir=spool_dir,
                           max_bodies_in_flight=max_bodies_in_flight, max_bodies_per_sender=max_bodies_per_sender,
                           max_spool_bytes=max_spool_bytes, max_unverified_bytes=max_unverified_bytes,
                           max_bearer_bytes=max_bearer_bytes, max_spool_bytes_per_key=max_spool_bytes_per_key,
                           max_bodies_per_tenant=max_bodies_per_tenant,
                           max_spool_bytes_per_tenant=max_spool_bytes_per_tenant,
                           body_min_rate_bytes_s=body_min_rate, max_body_s=max_body_seconds,
                           max_runs_per_window=max_runs_per_window, run_window_s=run_window_seconds)
    try:
        config.spool_limits  # noqa: B018 - the spool's shares must fit the spool: say so before serving
    except ValueError as exc:
        raise fail(str(exc)) from exc
    service = IngestService(config)
    # Each open connection costs memory before anyone is authenticated (at most h11's 16 KiB of
    # headers plus its buffers), so their number is bounded too; uvicorn answers the excess 503,
    # and a connection whose request head is late is closed (denpex.http_serving).
    serve(create_app(service), host=host, port=port, max_connections=max_connections,
          max_per_address=max_connections_per_address)


def _auth_string(value: str | None) -> SecretStr | None:
    return SecretStr(value) if value else None
