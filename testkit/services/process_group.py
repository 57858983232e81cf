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

__all__ = ["stop_process_group"]


def stop_process_group(proc: subprocess.Popen[bytes], *, timeout_s: float = 20.0,
                       sig: int = signal.SIGTERM) -> None:
    """``sig`` to ``proc``'s whole group, then SIGKILL to the group if ``proc`` outlives ``timeout_s``.

    ``proc`` must lead its group (started with ``start_new_session=True``); nothing else is signalled.
    """
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        proc.wait(timeout=10)
