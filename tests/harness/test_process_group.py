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

# A leader that starts a grandchild in the same group and ignores nothing.
LEADER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_stopping_a_leader_stops_what_it_started(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    leader = subprocess.Popen([sys.executable, "-c", LEADER, str(pid_file)], start_new_session=True)
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert _alive(child) and os.getpgid(child) == leader.pid
    stop_process_group(leader, timeout_s=10)
    assert leader.returncode is not None
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_a_leader_already_gone_is_left_alone(tmp_path: Path) -> None:
    leader = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    leader.wait(timeout=30)
    stop_process_group(leader)  # no group to signal: returns, raises nothing
    assert leader.returncode == 0
