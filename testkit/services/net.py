"""Loopback ports and HTTP readiness, shared by every service the kit starts."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from pathlib import Path

import httpx

__all__ = ["free_port", "free_port_block", "listener_port_range", "log_tail", "wait_http"]


def listener_port_range() -> tuple[int, int]:
    """Where the kit's servers get their ports: below the kernel's ephemeral range if there is room.

    A port found free is bound by the server a moment later. An outgoing connection (every test
    talks to moto, Prefect, sshd...) takes its port from the ephemeral range, and one that lands
    on the port in that moment makes the server exit ("Address already in use"; CI lost a run to
    a slurmd that way). Below the range, only another listener can take it.
    """
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    if ephemeral_low - 10000 >= 2000:
        return 10000, ephemeral_low
    return 20000, 60000


def port_free(port: int) -> bool:
    """Nothing listens on ``port`` on any address (servers such as slurmd bind 0.0.0.0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port_block(count: int) -> int:
    """First port of ``count`` consecutive free ports in ``listener_port_range()``."""
    low, high = listener_port_range()
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(low, high - count)
        if all(port_free(base + i) for i in range(count)):
            return base
    raise RuntimeError(f"no block of {count} free TCP ports found between {low} and {high}")


def free_port() -> int:
    """A free port for a server to take, outside the ephemeral range (see listener_port_range)."""
    return free_port_block(1)


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None,
              log: Path | None = None, *, interval_s: float = 0.2) -> None:
    """Poll ``url`` until it answers below 500; raise if ``proc`` exits first or time runs out.

    The error carries the end of ``log`` (the server's output), when given.
    """
    deadline = time.monotonic() + timeout_s
    # One client for the whole wait: a bare httpx.get builds an SSL context each time (66 ms of CPU
    # measured), which, five times a second through a slow server start, cost more than the start.
    with httpx.Client(timeout=2) as client:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{url}: the server exited with {proc.returncode}:\n" + log_tail(log))
            try:
                if client.get(url).status_code < 500:
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
