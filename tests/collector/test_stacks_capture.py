"""The collector's own stacks at a dump, and the py-spy sidecar, on real processes and threads.

The 4-rank Gloo job (collector stacks from every rank) and the 2-rank job with a regex-wedged
rank (py-spy sidecar) are in tests/gloo_real/test_gloo_stacks.py; here, one process at a time.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from denpex.collector import DumpTrigger, HangDumper
from denpex.collector.layout import record_path, request_path, stacks_path, write_atomic
from denpex.collector.pyspy_sidecar import (
    SidecarOptions,
    classify_pyspy_failure,
    default_py_spy,
    pyspy_stacks,
    run_sidecar,
)
from denpex.collector.stacks import capture_stacks, write_rank_stacks
from denpex.evidence.stacks import StackSource, Unavailable, read_collected_stacks, read_stacks_record
from test_fr_watchdog import Clock, MemoryRecorder, stuck

pytestmark = pytest.mark.timeout(180)

WEDGE = textwrap.dedent('''\
    import re, sys, threading, time

    def idle():
        time.sleep(3600)

    def wedge_in_regex():
        return re.match(r"(a+)+$", "a" * 40 + "b")

    threading.Thread(target=idle, name="helper", daemon=True).start()
    open(sys.argv[1], "w").close()
    wedge_in_regex()
''')
WEDGE_LINE = 7  # the re.match line of wedge_in_regex


def parked_in_named_function(release: threading.Event) -> None:
    release.wait(30)


def test_capture_names_every_thread_and_where_it_waits() -> None:
    release = threading.Event()
    worker = threading.Thread(target=parked_in_named_function, args=(release,), name="data-loader")
    worker.start()
    try:
        time.sleep(0.1)
        stacks = capture_stacks(3, taken_at=datetime.now(UTC))
    finally:
        release.set()
        worker.join()
    assert stacks.source is StackSource.COLLECTOR and stacks.pid == os.getpid() and stacks.rank == 3
    assert stacks.threads[0].name == "MainThread"
    loader = stacks.thread("data-loader")
    assert loader is not None
    user = next(fr for fr in loader.frames if fr.function == "parked_in_named_function")
    assert user.file == __file__
    assert user.line == inspect.getsourcelines(parked_in_named_function)[1] + 1
    assert [fr.function for fr in loader.frames[:2]] == ["Condition.wait", "Event.wait"]


def test_capture_keeps_the_innermost_frames_of_a_deep_recursion() -> None:
    def down(n: int) -> object:
        return capture_stacks(0, taken_at=datetime.now(UTC)) if n == 0 else down(n - 1)

    stacks = down(400)
    main = stacks.threads[0]
    assert main.name == "MainThread" and len(main.frames) == 128 and main.frames_dropped > 272
    assert main.frames[0].function == "capture_stacks"  # the capture sees itself, innermost
    assert all(fr.function.endswith("down") for fr in main.frames[1:])


def test_writing_stacks_never_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "collector"
    blocker.write_text("a file where the folder should be")
    assert write_rank_stacks(tmp_path, 0, taken_at=datetime.now(UTC)) is None


def test_hang_dumper_writes_the_stacks_beside_the_record(tmp_path: Path) -> None:
    recorder, clock = MemoryRecorder(stuck()), Clock()
    dumper = HangDumper(tmp_path, rank=2, collective_timeout=timedelta(seconds=4), recorder=recorder, clock=clock)
    record = dumper.dump_now(DumpTrigger.MANUAL, "test")
    stacks = read_stacks_record(stacks_path(tmp_path, 2))
    assert stacks.taken_at == record.dumped_at and stacks.rank == 2
    main = stacks.thread("MainThread")
    assert main is not None
    assert any(fr.function == "test_hang_dumper_writes_the_stacks_beside_the_record" for fr in main.frames)
    assert record.files == ["rank_2.pkl"]  # the stacks are no dump: uploads and readers skip them
    assert sorted(p.name for p in tmp_path.iterdir()) == ["collector", "rank_2.pkl"]
    assert read_collected_stacks(tmp_path).records == [stacks]


# -- the py-spy sidecar ------------------------------------------------------------------------

@pytest.mark.parametrize(("returncode", "stderr", "alive", "reason"), [
    pytest.param(1, "Permission Denied: Try running again with elevated permissions by going 'sudo env ...'",
                 True, Unavailable.PTRACE_REFUSED, id="permission-denied"),
    pytest.param(1, "Error: Operation not permitted (os error 1)", True, Unavailable.PTRACE_REFUSED, id="eperm"),
    pytest.param(1, "Error: Failed to get process executable name. Check that the process is running.",
                 False, Unavailable.PROCESS_GONE, id="gone"),
    pytest.param(None, "", True, Unavailable.TIMED_OUT, id="timed-out"),
    pytest.param(2, "Error: something else", True, Unavailable.FAILED, id="other"),
])
def test_pyspy_failures_are_classified(returncode: int | None, stderr: str, alive: bool, reason: Unavailable) -> None:
    failure = classify_pyspy_failure(returncode, stderr, process_alive=alive)
    assert failure.reason is reason
    assert failure.detail


@pytest.fixture
def wedged(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real Python process holding the GIL in C code (catastrophic regex backtracking)."""
    script = tmp_path / "wedge.py"
    script.write_text(WEDGE)
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, str(script), str(ready)])
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # into the regex
    yield proc
    proc.kill()
    proc.wait()


def test_pyspy_reads_a_process_wedged_in_c_code(wedged: subprocess.Popen[bytes], tmp_path: Path) -> None:
    stacks = pyspy_stacks(5, wedged.pid, py_spy=default_py_spy(), timeout=timedelta(seconds=30))
    assert stacks.unavailable is None, stacks.detail
    main = stacks.thread("MainThread")
    assert main is not None and main.holds_gil is True
    named = next(fr for fr in main.frames if fr.function == "wedge_in_regex")
    assert (Path(named.file).name, named.line) == ("wedge.py", WEDGE_LINE)


def test_sidecar_writes_pyspy_stacks_when_the_rank_misses_its_deadline(
        wedged: subprocess.Popen[bytes], tmp_path: Path) -> None:
    out = tmp_path / "out"
    options = SidecarOptions(out_dir=out, rank=1, pid=wedged.pid, deadline=timedelta(seconds=1),
                             poll=timedelta(seconds=0.1), py_spy=default_py_spy())
    threading.Timer(0.5, lambda: write_atomic(request_path(out), b'{"requested_by": "rank 0"}')).start()
    started = time.monotonic()
    written = run_sidecar(options, max_wait=timedelta(seconds=60))
    assert written == stacks_path(out, 1, StackSource.PY_SPY)
    assert time.monotonic() - started >= 1.5  # request at 0.5 s, then the 1 s deadline
    stacks = read_stacks_record(written)
    assert stacks.source is StackSource.PY_SPY and stacks.pid == wedged.pid
    main = stacks.thread("MainThread")
    assert main is not None and any(fr.function == "wedge_in_regex" and fr.line == WEDGE_LINE for fr in main.frames)
    assert not record_path(out, 1).exists()


def test_sidecar_says_ptrace_was_refused_and_still_writes(wedged: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """py-spy run as another user (nobody) may not trace a root process: the kernel refuses."""
    out = tmp_path / "out"
    write_atomic(request_path(out), b"{}")
    as_nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *default_py_spy())
    options = SidecarOptions(out_dir=out, rank=1, pid=wedged.pid, deadline=timedelta(seconds=0),
                             poll=timedelta(seconds=0.1), py_spy=as_nobody)
    # The request predates the sidecar: touch it again so the sidecar sees a fresh incident.
    threading.Timer(0.3, lambda: write_atomic(request_path(out), b"{}")).start()
    written = run_sidecar(options, max_wait=timedelta(seconds=60))
    assert written is not None
    stacks = read_stacks_record(written)
    assert stacks.unavailable is Unavailable.PTRACE_REFUSED and stacks.threads == []
    assert stacks.detail is not None and "Permission Denied" in stacks.detail


def test_sidecar_leaves_a_rank_that_dumped_by_itself_alone(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        out = tmp_path / "out"
        options = SidecarOptions(out_dir=out, rank=0, pid=proc.pid, deadline=timedelta(seconds=1),
                                 poll=timedelta(seconds=0.1), py_spy=default_py_spy())
        threading.Timer(0.3, lambda: write_atomic(request_path(out), b"{}")).start()
        threading.Timer(0.5, lambda: write_atomic(record_path(out, 0), b"{}")).start()
        assert run_sidecar(options, max_wait=timedelta(seconds=30)) is None
        assert not stacks_path(out, 0, StackSource.PY_SPY).exists()
    finally:
        proc.kill()
        proc.wait()


def test_sidecar_exits_with_the_job_and_says_when_the_rank_died_in_an_incident(tmp_path: Path) -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    out = tmp_path / "out"
    quiet = SidecarOptions(out_dir=out, rank=0, pid=ended.pid, poll=timedelta(seconds=0.1), py_spy=default_py_spy())
    assert run_sidecar(quiet, max_wait=timedelta(seconds=10)) is None  # no incident: the job ended
    assert not stacks_path(out, 0, StackSource.PY_SPY).exists()

    dying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        options = SidecarOptions(out_dir=out, rank=0, pid=dying.pid, deadline=timedelta(seconds=30),
                                 poll=timedelta(seconds=0.1), py_spy=default_py_spy())
        threading.Timer(0.3, lambda: write_atomic(record_path(out, 3), b"{}")).start()  # a peer dumped
        threading.Timer(0.8, lambda: (dying.kill(), dying.wait())).start()  # then the rank died
        started = time.monotonic()
        written = run_sidecar(options, max_wait=timedelta(seconds=20))
        assert time.monotonic() - started < 20  # long before the 30 s deadline (room for a loaded machine)
    finally:
        dying.kill()
        dying.wait()
    assert written is not None
    stacks = read_stacks_record(written)
    assert stacks.unavailable is Unavailable.PROCESS_GONE and stacks.threads == []


def test_sidecar_without_a_shared_folder_takes_the_request_from_the_job_store(
        wedged: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """The sidecar's own command line, watching a real TCPStore for StoreDumpSignal's request."""
    import torch.distributed as dist

    from denpex.collector import DumpRequest, StoreDumpSignal

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    out = tmp_path / "local-only"
    argv = [sys.executable, "-m", "denpex.collector.pyspy_sidecar", "--out", str(out), "--rank", "4",
            "--pid", str(wedged.pid), "--deadline-s", "1", "--poll-s", "0.1",
            "--signal-store", f"127.0.0.1:{store.port}"]
    sidecar = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        time.sleep(1.0)
        assert sidecar.poll() is None  # no request yet: it waits
        StoreDumpSignal(store).send(DumpRequest(requested_by="rank 0", reason="stalled",
                                                requested_at=datetime.now(UTC)))
        output, _ = sidecar.communicate(timeout=60)
    finally:
        sidecar.kill()
    assert sidecar.returncode == 0, output.decode(errors="replace")
    stacks = read_stacks_record(stacks_path(out, 4, StackSource.PY_SPY))
    main = stacks.thread("MainThread")
    assert main is not None and any(fr.function == "wedge_in_regex" and fr.line == WEDGE_LINE for fr in main.frames)
