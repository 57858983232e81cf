"""A service stopped with its group: what it started (a forkserver, the runs forked from it)
goes with it. The flow rig's ``flows.serve`` left its paused runs waiting on the API for their
whole pause timeout after the session stopped it (seen after a CI run: 24 processes, ~3 GB)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from testkit.services.process_group import stop_process_group

# A leader that starts a grandchild in its group. The grandchild ignores SIGTERM, as a forked run
# still shutting down does; the leader dies of SIGTERM at once, or exits by itself with "exit".
LEADER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
                          "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"])
open(sys.argv[1], "w").write(str(child.pid))
if sys.argv[2] == "exit":
    sys.exit(0)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], int]:
    pid_file = tmp_path / "child.pid"
    leader = subprocess.Popen([sys.executable, "-c", LEADER, str(pid_file), mode], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert os.getpgid(child) == leader.pid
    return leader, child


def _gone_soon(pid: int) -> bool:
    deadline = time.monotonic() + 60  # sized for a loaded machine; returns at the event
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_stopping_a_leader_stops_what_it_started_even_what_ignores_sigterm(tmp_path: Path) -> None:
    leader, child = _start(tmp_path, "stay")
    assert _alive(child)
    started = time.monotonic()
    stop_process_group(leader, timeout_s=60)
    # The leader died of SIGTERM at once; its grandchild did not wait for the leader's timeout.
    assert leader.returncode == -15 and time.monotonic() - started < 30
    assert _gone_soon(child)


def test_a_leader_already_gone_still_takes_its_group_with_it(tmp_path: Path) -> None:
    leader, child = _start(tmp_path, "exit")
    leader.wait(timeout=30)
    assert _alive(child)  # orphaned in the leader's group
    stop_process_group(leader)
    assert leader.returncode == 0 and _gone_soon(child)
