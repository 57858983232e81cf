"""``denpex node-agent``: send this host's kernel log to the ingest service (``denpex.collector.node_agent``).

Exit status 0 when the service took it (or already held it), 1 when the service refused it (its
answer is printed), 2 for unusable input (no configuration, an unreadable log).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from denpex.cli.exits import fail
from denpex.collector.node_agent import SEND_ATTEMPTS, NodeAgentError, read_kernel_log, send_telemetry
from denpex.collector.uploader import UploadTarget, service_busy

__all__ = ["node_agent_command"]

EXIT_REFUSED = 1


def _time(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise fail(f"{option} {value!r} is not an ISO time such as 2026-12-01T13:00:00Z") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def node_agent_command(
    job: Annotated[str | None, typer.Option("--job", help="The job whose incident this is (default: "
                                            "$DENPEX_JOB_ID or the scheduler's, $SLURM_JOB_ID).")] = None,
    incident: Annotated[str | None, typer.Option("--incident", help="The incident id (default: the job's open "
                                                 "incident).")] = None,
    files: Annotated[list[Path] | None, typer.Option("--file", help="A kernel log file (journalctl -k -o "
                                                      "short-iso format); repeatable.")] = None,
    journalctl: Annotated[bool, typer.Option("--journalctl", help="Read `journalctl -k` (with --since/--until).")]
    = False,
    since: Annotated[str | None, typer.Option("--since", help="With --journalctl: from this ISO time.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="With --journalctl: up to this ISO time.")] = None,
) -> None:
    """On a GPU node, with its host-bound key: send its kernel log for a job's incident (no dump needed).

    Example:

    \b
    denpex node-agent --job 4211 --journalctl --since 2026-12-05T10:00:00Z
    """
    env = dict(os.environ)
    if job:
        env["DENPEX_JOB_ID"] = job
    try:
        target = UploadTarget.from_env(env)
    except ValueError as exc:
        raise fail(str(exc)) from exc
    if target is None:
        raise fail("DENPEX_INGEST_URL is not set; set it with DENPEX_INGEST_KEY_ID, DENPEX_INGEST_SECRET, "
                   "DENPEX_TENANT and DENPEX_CLUSTER (a key bound to this host)")
    if not files and not journalctl:
        raise fail("nothing to send: give --file PATH or --journalctl")
    try:
        data = read_kernel_log(list(files or []), journalctl=journalctl, since=_time(since, "--since"),
                               until=_time(until, "--until"))
        response = send_telemetry(target, data, incident_id=incident)
    except NodeAgentError as exc:
        raise fail(str(exc)) from exc
    typer.echo(response.text)
    if response.status_code >= 300:
        if service_busy(response.status_code):
            raise fail(f"the service was busy on every try (HTTP {response.status_code} to the last of "
                       f"{SEND_ATTEMPTS}); send it again later", EXIT_REFUSED)
        raise fail(f"the service refused the telemetry (HTTP {response.status_code})", EXIT_REFUSED)
