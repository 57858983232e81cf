"""``denpex serve-approvals``: the approval page, its own process and port."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated

import typer
from pydantic import SecretStr

from denpex.approval_page.hosts import check_host_pattern
from denpex.cli.exits import fail
from denpex.isolation.errors import ConfigError
from denpex.isolation.page_record import (
    load_or_create_signing_key,
    public_key_path,
    signing_key_path,
    write_public_key,
)
from denpex.state_dir import StateDirError, resolve_state_dir

__all__ = ["serve_approvals_command"]


def serve_approvals_command(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")] = 8090,
    signing_key_file: Annotated[Path | None, typer.Option(
        "--signing-key-file", help="The page's ed25519 private key (PEM, mode 0600), e.g. a mounted secret "
                                   "(default: STATE_DIR/approval-page/signing.key, created on first start).")] = None,
    trusted_proxy: Annotated[list[str] | None, typer.Option(
        "--trusted-proxy", metavar="ADDRESS", help="An authenticating proxy's address or network (repeatable); "
                                                   "its identity header is read from these only.")] = None,
    allowed_host: Annotated[list[str] | None, typer.Option(
        "--allowed-host", metavar="NAME", help="A host name the page is reached by (repeatable; *.example.com "
                                               "takes its subdomains). IP addresses and localhost always are; "
                                               "any other Host is refused, against DNS rebinding.")] = None,
    identity_header: Annotated[str, typer.Option(
        "--identity-header", help="The header that names the signed-in person, from a trusted proxy.")]
        = "X-Forwarded-User",
    prefect_api_url: Annotated[str | None, typer.Option(
        "--prefect-api-url", help="The Prefect API that runs are resumed through (default: $PREFECT_API_URL).")] = None,
    prefect_ui_url: Annotated[str | None, typer.Option(
        "--prefect-ui-url", help="The Prefect UI, for a link to each run (default: $PREFECT_UI_URL).")] = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="State directory (default: "
                                                                       "$DENPEX_STATE_DIR).")] = None,
    max_connections_per_address: Annotated[int, typer.Option(
        "--max-connections-per-address", min=1,
        help="Connections one client address (an IPv6 /64) may hold at once, of the page's 256; more are "
             "answered 503 (default 32).")] = 32,
) -> None:
    """Serve the approval page: each paused run's brief, and its one signed decision.

    Example:

    \b
    PREFECT_API_URL=http://127.0.0.1:4200/api denpex serve-approvals --port 8090
    """
    from denpex.http_serving import serve
    from denpex.approval_page.app import PageConfig, create_page_app
    from denpex.approval_page.decide import ApprovalDesk
    from denpex.approval_page.resume import PrefectLink
    from denpex.approval_page.store import ApprovalBook

    try:
        resolved = resolve_state_dir(state_dir)
        key = load_or_create_signing_key(signing_key_file or signing_key_path(resolved),
                                         create=signing_key_file is None)
        networks = tuple(ipaddress.ip_network(a, strict=False) for a in trusted_proxy or [])
    except (StateDirError, ConfigError) as exc:
        raise fail(str(exc)) from exc
    except ValueError as exc:
        raise fail(f"--trusted-proxy: {exc}") from exc
    try:
        hosts = tuple(check_host_pattern(name) for name in allowed_host or [])
    except ValueError as exc:
        raise fail(f"--allowed-host: {exc}") from exc
    api = prefect_api_url or os.environ.get("PREFECT_API_URL")
    if not api:
        raise fail("the page resumes runs through the Prefect API: set PREFECT_API_URL or --prefect-api-url")
    # The public half where the flow's workers look by default (DENPEX_APPROVAL_PAGE_KEY may name another copy).
    write_public_key(key, public_key_path(resolved))
    auth = os.environ.get("PREFECT_API_AUTH_STRING")  # from the environment only: an option would show in `ps`
    desk = ApprovalDesk(state_dir=resolved, book=ApprovalBook(resolved), key=key)
    config = PageConfig(desk=desk, prefect=PrefectLink(api, SecretStr(auth) if auth else None),
                        trusted_proxies=networks, identity_header=identity_header, allowed_hosts=hosts,
                        prefect_ui_url=prefect_ui_url or os.environ.get("PREFECT_UI_URL"))
    serve(create_page_app(config), host=host, port=port, max_connections=256,
          max_per_address=max_connections_per_address)
