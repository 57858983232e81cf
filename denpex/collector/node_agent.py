"""A node agent's telemetry without a dump: its host's kernel log for a job's incident.

The rank that died on this node (its GPU fell off the bus, the OOM killer took it) left no dump, so
nothing else would carry this node's Xid to the service. The agent runs with a key bound to this
host (``denpex keys create --host NODE``): only such telemetry may support a drain.

    denpex node-agent --job 4242 --file /var/log/kern.log          # a given file
    denpex node-agent --job 4242 --journalctl --since 2026-12-01T13:00:00Z

Credentials come from the environment, as the collector's do (never an option: it would show in
``ps``): ``DENPEX_INGEST_URL``, ``DENPEX_INGEST_KEY_ID``, ``DENPEX_INGEST_SECRET``, ``DENPEX_TENANT``,
``DENPEX_CLUSTER``. Without ``--incident`` the telemetry joins the job's one open incident (the service
refuses it, 409, when the job has several: name the incident then); telemetry alone opens no incident.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from datetime import datetime
from pathlib import Path

import httpx

from denpex.collector.uploader import Backoff, UploadTarget, service_busy
from denpex.ingest.client import IngestClient

__all__ = ["MAX_SEND_BYTES", "NodeAgentError", "SEND_ATTEMPTS", "read_kernel_log", "journalctl_argv", "send_telemetry"]

# Tries of one send: the default backoff waits about 15 s in all between them, and a service that
# asks for longer with Retry-After gets at most 30 s a wait.
SEND_ATTEMPTS = 6

MAX_SEND_BYTES = 32 * 1024 * 1024
"""The most kernel log one send carries: the newest lines are kept (the service's cap is 64 MiB)."""


class NodeAgentError(Exception):
    """The log cannot be read or the service cannot be reached (one clear sentence)."""


def journalctl_argv(since: datetime | None, until: datetime | None) -> list[str]:
    """``journalctl -k`` in the kernel-log format Denpex parses (docs/contracts.md, Telemetry)."""
    argv = ["journalctl", "-k", "-o", "short-iso", "--no-pager"]
    if since is not None:
        argv += ["--since", since.strftime("%Y-%m-%d %H:%M:%S UTC")]
    if until is not None:
        argv += ["--until", until.strftime("%Y-%m-%d %H:%M:%S UTC")]
    return argv


def read_kernel_log(files: list[Path], *, journalctl: bool = False, since: datetime | None = None,
                    until: datetime | None = None, max_bytes: int = MAX_SEND_BYTES) -> bytes:
    """The files' bytes (and ``journalctl -k``'s output), the newest ``max_bytes`` of them, whole lines."""
    parts: list[bytes] = []
    for path in files:
        try:
            with path.open("rb") as handle:
                size = handle.seek(0, 2)
                handle.seek(max(0, size - max_bytes))
                parts.append(handle.read(max_bytes))
        except OSError as exc:
            raise NodeAgentError(f"{path}: cannot read the kernel log: {exc.strerror or exc}") from exc
    if journalctl:
        program = shutil.which("journalctl")
        if program is None:
            raise NodeAgentError("journalctl is not installed on this node; pass the kernel log with --file")
        argv = journalctl_argv(since, until)
        done = subprocess.run([program, *argv[1:]], capture_output=True, timeout=120, check=False)
        if done.returncode != 0:
            raise NodeAgentError(f"{' '.join(argv)} failed: {done.stderr.decode(errors='replace').strip()[:300]}")
        parts.append(done.stdout)
    data = b"\n".join(p.rstrip(b"\n") for p in parts if p) + b"\n"
    if len(data) > max_bytes:
        data = data[-max_bytes:]
        data = data[data.find(b"\n") + 1:]  # a cut line is no line
    return data


def send_telemetry(target: UploadTarget, data: bytes, *, incident_id: str | None = None,
                   timeout_s: float = 60.0, attempts: int = SEND_ATTEMPTS,
                   backoff: Backoff | None = None) -> httpx.Response:
    """``POST /v1/evidence`` with this host's telemetry and no dump (a host-bound key's upload).

    A busy service (408, 429, a 5xx such as 503 when its connection or spool bounds are full) or no
    answer is tried again, up to ``attempts`` times, after the service's ``Retry-After`` or the
    collector's backoff, as the collector's uploader does: each try is signed afresh, so it is no
    replay. Any other answer (a 4xx: refused) is returned at once."""
    client = IngestClient(target.url, key_id=target.key_id, secret=target.secret, tenant=target.tenant,
                          cluster=target.cluster, timeout_s=timeout_s)
    identity = {"job_id": target.job_id} | ({"incident_id": incident_id} if incident_id else {})
    backoff = backoff or Backoff()
    for attempt in range(max(1, attempts)):
        last = attempt + 1 >= max(1, attempts)
        try:
            response = client.upload_telemetry(identity, [data])
        except httpx.HTTPError as exc:
            if last:
                raise NodeAgentError(f"the ingest service at {target.url} cannot be reached "
                                     f"({max(1, attempts)} tries): {exc}") from exc
            time.sleep(backoff.delay(attempt))
            continue
        if last or not service_busy(response.status_code):
            return response
        time.sleep(_retry_after(response, backoff, attempt))
    raise AssertionError("unreachable: the last attempt returns or raises")


def _retry_after(response: httpx.Response, backoff: Backoff, attempt: int) -> float:
    """The service's ``Retry-After`` in seconds, bounded by the backoff's longest delay."""
    try:
        return min(backoff.max_s, max(0.0, float(response.headers.get("retry-after", ""))))
    except ValueError:
        return backoff.delay(attempt)
