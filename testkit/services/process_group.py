"""Stopping a service with everything it started.

A service the kit starts in its own session (``start_new_session=True``) leads a process group:
``flows.serve`` with its forkserver and the flow runs forked from it (a paused run waits on the
API until its pause times out), the Prefect server with uvicorn, the ingest service with its
dump-checking workers. Signalling only the leader leaves the rest running after the test.
"""

from __future__ import annotations

import os
import signal
import subprocess

__all__ = ["signal_group", "stop_process_group"]


def stop_process_group(proc: subprocess.Popen[bytes], *, timeout_s: float = 20.0,
                       sig: int = signal.SIGTERM) -> None:
    """``sig`` to ``proc``'s whole group; once ``proc`` exits, or outlives ``timeout_s``, SIGKILL to
    what is left of the group (a forked run still shutting down when its leader is gone).

    ``proc`` must lead its group (started with ``start_new_session=True``); nothing else is signalled.
    """
    if proc.poll() is None:
        signal_group(proc, sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
    signal_group(proc, signal.SIGKILL)
    proc.wait(timeout=10)


def signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    """``signum`` to the group ``proc`` leads; nothing when the whole group is gone."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
