"""The one file lock the workers share (``denpex.isolation.file_lock``), across real processes:
it excludes another holder, refuses at once when asked not to wait, and dies with its holder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from denpex.isolation.errors import ConfigError
from denpex.isolation.file_lock import LockHeld, file_lock

HOLDER = """
import sys, time
from pathlib import Path
from denpex.isolation.file_lock import file_lock
with file_lock(Path(sys.argv[1]), what="the test lock", error=RuntimeError, mode="a+") as handle:
    handle.write("holder 42\\n"); handle.flush()
    print("held", flush=True)
    sys.stdin.readline()  # hold until told, or until killed
"""


def _holder(path: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_held_lock_is_refused_at_once_with_what_its_holder_wrote(tmp_path: Path) -> None:
    path = tmp_path / "state" / "x.lock"
    holder = _holder(path)
    try:
        with pytest.raises(LockHeld) as held, file_lock(path, what="the test lock", error=ConfigError, wait=False,
                                                         mode="a+"):
            pass
        assert held.value.note == "holder 42"
    finally:
        holder.kill()
        holder.wait()


def test_the_lock_dies_with_its_holder(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    holder = _holder(path)
    holder.kill()  # a crash: no unlock ran
    holder.wait()
    with file_lock(path, what="the test lock", error=ConfigError, wait=False):
        pass


def test_a_waiting_lock_is_taken_once_the_holder_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    holder = _holder(path)
    assert holder.stdin is not None
    holder.stdin.write("\n")
    holder.stdin.flush()
    with file_lock(path, what="the test lock", error=ConfigError):  # waits for the holder's release
        assert holder.wait(timeout=120) == 0


def test_a_lock_that_cannot_be_opened_names_it(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"file/x\.lock: cannot open the test lock: "):
        with file_lock(tmp_path / "file" / "x.lock", what="the test lock", error=ConfigError):
            pass
