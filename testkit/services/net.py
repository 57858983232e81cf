"""Loopback ports and HTTP readiness, shared by every service the kit starts."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx

__all__ = ["free_port", "log_tail", "wait_http"]


def free_port() -> int:
    """A port the kernel just handed out (bind to 0), free for a server to take."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None,
              log: Path | None = None, *, interval_s: float = 0.2) -> None:
    """Poll ``url`` until it answers below 500; raise if ``proc`` exits first or time runs out.

    The error carries the end of ``log`` (the server's output), when given.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}:\n" + log_tail(log))
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval_s)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s:\n" + log_tail(log))


def log_tail(log: Path | None, size: int = 4000) -> str:
    """The end of a server's log (for an error message); empty when there is none."""
    if log is None or not log.exists():
        return ""
    return log.read_text(errors="replace")[-size:]
