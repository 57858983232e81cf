"""A small process beside each rank that reads the rank's stacks with py-spy when it cannot dump.

A rank whose interpreter is wedged (the GIL held in C code: a regular expression backtracking, a
C extension spinning, a deadlock in the main thread that holds the GIL) never runs its own
watchdog thread, so it writes no dump, no record and no stacks. py-spy reads a process's Python
stacks from outside, through ptrace, whatever its interpreter does. The sidecar is started by the
rank at job start (:func:`start_stacks_sidecar`), so it is a separate process that outlives a wedge:

- it watches the dump folder for an incident: the shared request file, or any rank's record,
  written after the sidecar started (and, for jobs without a shared folder, the request key of a
  :class:`~denpex.collector.dump_signal.StoreDumpSignal` in the job's TCPStore);
- when the rank's own record has not appeared ``deadline`` after the incident was seen, it runs
  ``py-spy dump --pid PID --json`` and writes the result beside the dump,
  ``<out>/collector/rank_<r>.py-spy.stacks.json``, with ``source: py-spy``;
- where ptrace is refused (Yama ``ptrace_scope``, a container without ``SYS_PTRACE``, another
  user), where py-spy is missing, times out or the process is gone, it writes the same file with
  ``unavailable`` and py-spy's words in ``detail``: the report says why there is no stack;
- it exits once the rank dumped by itself, once it wrote its file, or once the rank's process is
  gone without an incident (the job ended).

Yama ``ptrace_scope`` 1 lets only a process's ancestors trace it; the sidecar is the rank's child,
so :func:`start_stacks_sidecar` declares it the rank's tracer (``PR_SET_PTRACER``).

    python -m denpex.collector.pyspy_sidecar --out DIR --rank R --pid PID [--deadline-s 20]
        [--signal-store HOST:PORT] [-- PY-SPY COMMAND]
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from denpex.collector.dump_signal import DumpSignal, StoreDumpSignal
from denpex.collector.layout import COLLECTOR_DIR, record_path, request_path, stacks_path, write_atomic
from denpex.evidence.stacks import RankStacks, StackError, StackSource, Unavailable, parse_pyspy_dump

__all__ = ["PySpyFailure", "SidecarOptions", "classify_pyspy_failure", "main", "pyspy_stacks", "run_sidecar",
           "start_stacks_sidecar"]

_log = logging.getLogger(__name__)
_PR_SET_PTRACER = 0x59616D61
_DETAIL_CHARS = 400


@dataclass(frozen=True, slots=True)
class PySpyFailure:
    """Why py-spy printed no stacks, from its exit and its words."""

    reason: Unavailable
    detail: str


def classify_pyspy_failure(returncode: int | None, stderr: str, *, process_alive: bool) -> PySpyFailure:
    """py-spy's failure as an :class:`Unavailable` reason.

    ``(1, "Permission Denied: Try running again with elevated permissions ...", True)`` ->
    PTRACE_REFUSED; a process that is gone -> PROCESS_GONE; ``None`` (killed at its timeout)
    -> TIMED_OUT; anything else -> FAILED. ``detail`` is the first lines py-spy printed.
    """
    first = " ".join(line.strip() for line in stderr.strip().splitlines()[:2])[:_DETAIL_CHARS]
    lowered = stderr.lower()
    if returncode is None:
        return PySpyFailure(Unavailable.TIMED_OUT, first or "py-spy did not answer in time")
    if not process_alive:
        return PySpyFailure(Unavailable.PROCESS_GONE, first or "the process exited")
    if any(s in lowered for s in ("permission denied", "operation not permitted", "ptrace")):
        return PySpyFailure(Unavailable.PTRACE_REFUSED, first)
    return PySpyFailure(Unavailable.FAILED, first or f"py-spy exited with status {returncode}")


def pyspy_stacks(rank: int, pid: int, *, py_spy: Sequence[str], timeout: timedelta) -> RankStacks:
    """``py-spy dump --pid PID --json`` of ``pid`` as a :class:`RankStacks`, or one that says why not."""
    taken_at = datetime.now(UTC)
    argv = [*py_spy, "dump", "--pid", str(pid), "--json"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout.total_seconds(), check=False)
    except FileNotFoundError:
        return _unavailable(rank, pid, taken_at, PySpyFailure(Unavailable.READER_MISSING,
                                                              f"{py_spy[-1]} is not installed"))
    except subprocess.TimeoutExpired as exc:
        stderr = (exc.stderr or b"").decode(errors="replace")
        return _unavailable(rank, pid, taken_at, classify_pyspy_failure(None, stderr, process_alive=True))
    stderr = done.stderr.decode(errors="replace")
    if done.returncode != 0:
        failure = classify_pyspy_failure(done.returncode, stderr, process_alive=_alive(pid))
        return _unavailable(rank, pid, taken_at, failure)
    try:
        return parse_pyspy_dump(done.stdout, rank=rank, taken_at=taken_at, pid=pid)
    except StackError as exc:
        return _unavailable(rank, pid, taken_at, PySpyFailure(Unavailable.FAILED, str(exc)))


def _unavailable(rank: int, pid: int, taken_at: datetime, failure: PySpyFailure) -> RankStacks:
    return RankStacks(rank=rank, source=StackSource.PY_SPY, taken_at=taken_at, pid=pid,
                      unavailable=failure.reason, detail=failure.detail)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


@dataclass(frozen=True, slots=True)
class SidecarOptions:
    """What one sidecar watches and how long it gives the rank."""

    out_dir: Path
    rank: int
    pid: int
    deadline: timedelta = timedelta(seconds=20)
    """From the incident (first request or record seen) to py-spy: the rank's own dump answers a
    request within a poll interval plus its dump time (the first pickle dump takes seconds)."""
    poll: timedelta = timedelta(seconds=0.5)
    py_spy: tuple[str, ...] = ("py-spy",)
    pyspy_timeout: timedelta = timedelta(seconds=30)


def run_sidecar(options: SidecarOptions, *, signal: DumpSignal | None = None,
                max_wait: timedelta | None = None) -> Path | None:
    """Watch until the rank dumps by itself, its process ends, or it misses its deadline (then
    write py-spy's stacks). Returns the file written, if any. ``max_wait`` bounds the whole watch.

    ``signal``: the job's :class:`~denpex.collector.dump_signal.DumpSignal` when it is not a file
    in the dump folder (a :class:`~denpex.collector.dump_signal.StoreDumpSignal`, for ranks
    without a shared folder); a request there is an incident too.
    """
    started = time.time()
    incident_at: float | None = None
    while max_wait is None or time.time() - started < max_wait.total_seconds():
        if _newer(record_path(options.out_dir, options.rank), started):
            return None  # the rank dumped by itself, stacks included
        alive = _alive(options.pid)
        if incident_at is None and (_incident(options.out_dir, started) or _requested(signal)):
            incident_at = time.time()
            _log.info("rank %d: incident seen; py-spy in %.1fs unless it dumps", options.rank,
                      options.deadline.total_seconds())
        if not alive and incident_at is None:
            return None  # the job ended; nothing to read
        if incident_at is not None and (not alive or time.time() - incident_at >= options.deadline.total_seconds()):
            # A dead rank's pid may be reused at any moment: never point py-spy at it.
            stacks = (pyspy_stacks(options.rank, options.pid, py_spy=options.py_spy, timeout=options.pyspy_timeout)
                      if alive else _unavailable(options.rank, options.pid, datetime.now(UTC), PySpyFailure(
                          Unavailable.PROCESS_GONE, f"process {options.pid} exited before its stacks were read")))
            path = stacks_path(options.out_dir, options.rank, StackSource.PY_SPY)
            write_atomic(path, stacks.model_dump_json().encode())
            _log.warning("rank %d missed its dump: py-spy's stacks (%s) written to %s", options.rank,
                         stacks.unavailable.value if stacks.unavailable else "read", path)
            return path
        time.sleep(options.poll.total_seconds())
    return None


def _newer(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since
    except OSError:
        return False


def _incident(out_dir: Path, since: float) -> bool:
    """A dump request, or any rank's record, written since the sidecar started."""
    if _newer(request_path(out_dir), since):
        return True
    return any(_newer(p, since) for p in (out_dir / COLLECTOR_DIR).glob("rank_*.record.json"))


def _requested(signal: DumpSignal | None) -> bool:
    if signal is None:
        return False
    try:
        return signal.receive() is not None
    except Exception:  # noqa: BLE001 - a store that went away (its host died) is no request
        return False


def default_py_spy() -> tuple[str, ...]:
    """py-spy beside this interpreter (a venv's ``bin/``), else on ``PATH``, else the bare name."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file():
        return (str(beside),)
    return (shutil.which("py-spy") or "py-spy",)


def start_stacks_sidecar(out_dir: Path, rank: int, *, deadline: timedelta = timedelta(seconds=20),
                         py_spy: Sequence[str] | None = None, log_file: Path | None = None,
                         signal_store: str | None = None) -> subprocess.Popen[bytes]:
    """Start this rank's sidecar (call once, at job start) and allow it to trace this process.

    ``signal_store`` (``HOST:PORT``): the TCPStore a :class:`StoreDumpSignal` uses, when the dump
    folder is not shared. The caller owns the returned process: it exits by itself when this
    process ends; terminate it at a clean shutdown.
    """
    argv = [sys.executable, "-m", "denpex.collector.pyspy_sidecar", "--out", str(out_dir), "--rank", str(rank),
            "--pid", str(os.getpid()), "--deadline-s", str(deadline.total_seconds()),
            *(["--signal-store", signal_store] if signal_store else []), "--", *(py_spy or default_py_spy())]
    log = log_file.open("ab") if log_file else subprocess.DEVNULL
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    finally:
        if log_file:
            log.close()  # type: ignore[union-attr]
    _allow_tracer(child.pid)
    return child


def _allow_tracer(pid: int) -> None:
    """Under Yama ``ptrace_scope`` 1 only ancestors may trace: name the sidecar as allowed."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PTRACER, pid, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # no Yama (EINVAL) or no prctl: ptrace rules are then the kernel's defaults


def main(argv: Sequence[str] | None = None) -> int:
    """The sidecar's entry point; anything after ``--`` is the py-spy command."""
    p = argparse.ArgumentParser(prog="python -m denpex.collector.pyspy_sidecar")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--deadline-s", type=float, default=20.0)
    p.add_argument("--poll-s", type=float, default=0.5)
    p.add_argument("--signal-store", metavar="HOST:PORT",
                   help="also watch the job's TCPStore for a dump request (StoreDumpSignal's key)")
    p.add_argument("py_spy", nargs="*", help="the py-spy command (default: beside this Python)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s stacks sidecar rank {args.rank} %(message)s")
    options = SidecarOptions(out_dir=args.out, rank=args.rank, pid=args.pid,
                             deadline=timedelta(seconds=args.deadline_s), poll=timedelta(seconds=args.poll_s),
                             py_spy=tuple(args.py_spy) or default_py_spy())
    run_sidecar(options, signal=_store_signal(args.signal_store) if args.signal_store else None)
    return 0


def _store_signal(address: str) -> StoreDumpSignal:
    """A client of the job's TCPStore (torch imported only here: the file-watching sidecar needs none)."""
    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    return StoreDumpSignal(dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30)))


if __name__ == "__main__":
    raise SystemExit(main())
