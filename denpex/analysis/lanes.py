"""Decode worker processes, one job per worker at a time, handed out fairly across tenants.

Each lane is a pool of exactly one process, so a worker that dies (killed for CPU, crashed by a
dump) fails only the job it held; a shared pool would fail every job in flight with it, another
tenant's included. A thread per lane takes the next job, runs it on its process and watches the
process's CPU time: a job past its CPU allowance is a decode stuck in C, where the in-worker limit
(``denpex.evidence.cpu_budget``) cannot reach, and the lane kills its process and starts another.

Fairness: jobs wait in one queue per key (a tenant), served round-robin, and while another key
waits no key holds more than ``lanes - 1`` lanes, so one tenant's flood of slow dumps delays
another's upload by at most one job's CPU allowance, never by the flood.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = ["Lanes", "LaneKilled"]

_T = TypeVar("_T")
# How often a lane looks at its worker's CPU time while a job runs.
_POLL_S = 0.2
# CPU seconds past a job's allowance before its worker is killed: the in-worker limit normally
# ends the decode first, with a clear message and no new process.
_GRACE_S = 2.0
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class LaneKilled(RuntimeError):
    """The job's worker was killed because the job ran past its CPU allowance."""

    def __init__(self, allowance_s: float) -> None:
        super().__init__(f"ran past {allowance_s:.1f} s of CPU")
        self.allowance_s = allowance_s


@dataclass
class _Job(Generic[_T]):
    key: str
    fn: Callable[..., _T]
    args: tuple[Any, ...]
    cpu_s: float | None
    future: Future[_T] = field(default_factory=Future)


def _pid() -> int:
    return os.getpid()


def _cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


class Lanes:
    """``lanes`` worker processes from a forkserver, each started by ``initializer``."""

    def __init__(self, lanes: int, *, initializer: Callable[..., None] | None = None,
                 initargs: tuple[Any, ...] = (), preload: Sequence[str] = ()) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be at least 1, not {lanes}")
        self._lanes = lanes
        self._initializer = initializer
        self._initargs = initargs
        self._preload = list(preload)
        self._cond = threading.Condition()
        self._waiting: dict[str, deque[_Job[Any]]] = {}
        self._turns: deque[str] = deque()
        self._running: dict[str, int] = {}
        self._closed = False
        self._pools: list[ProcessPoolExecutor | None] = [None] * lanes
        # Each lane's worker pid, asked of the worker when its pool starts (the CPU watch reads it).
        self._pids: list[Future[int] | None] = [None] * lanes
        self._pools_lock = threading.Lock()
        self._threads = [threading.Thread(target=self._serve, args=(i,), daemon=True, name=f"lane-{i}")
                         for i in range(lanes)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., _T], *args: Any, key: str = "", cpu_s: float | None = None) -> Future[_T]:
        """Queue ``fn(*args)`` for ``key``; past ``cpu_s`` CPU seconds (plus a grace) its worker
        is killed and the future fails with ``LaneKilled``. A dead worker fails it with
        ``BrokenProcessPool``."""
        job: _Job[_T] = _Job(key, fn, args, cpu_s)
        with self._cond:
            if self._closed:
                raise RuntimeError("these workers are closed")
            if key not in self._waiting:
                self._waiting[key] = deque()
                self._turns.append(key)
            self._waiting[key].append(job)
            self._cond.notify_all()
        return job.future

    def warm(self) -> None:
        """Start every lane's process now, without waiting for it."""
        for lane in range(self._lanes):
            self._pool(lane)

    def close(self) -> None:
        """Fail what still waits, stop the lanes and their processes."""
        with self._cond:
            self._closed = True
            for queue in self._waiting.values():
                for job in queue:
                    job.future.cancel()
            self._waiting.clear()
            self._turns.clear()
            self._cond.notify_all()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        with self._pools_lock:
            pools, self._pools = self._pools, [None] * self._lanes
            self._pids = [None] * self._lanes
        for pool in pools:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def worker_pids(self) -> set[int]:
        """The process ids of the lanes' current workers, once each has started (it waits)."""
        with self._pools_lock:
            asked = [pid for pid in self._pids if pid is not None]
        return {pid.result() for pid in asked if pid.exception() is None}

    def _next(self) -> _Job[Any] | None:
        """The next job this lane may take, or None (called with the condition held)."""
        for _ in range(len(self._turns)):
            key = self._turns[0]
            self._turns.rotate(-1)
            others_wait = any(q for k, q in self._waiting.items() if k != key)
            if others_wait and self._lanes > 1 and self._running.get(key, 0) >= self._lanes - 1:
                continue
            queue = self._waiting[key]
            if queue:
                job = queue.popleft()
                if not queue:
                    del self._waiting[key]
                    self._turns.remove(key)
                return job
        return None

    def _serve(self, lane: int) -> None:
        while True:
            with self._cond:
                job = self._next()
                while job is None and not self._closed:
                    self._cond.wait()
                    job = self._next()
                if job is None:
                    return
                self._running[job.key] = self._running.get(job.key, 0) + 1
            try:
                if job.future.set_running_or_notify_cancel():
                    self._run(lane, job)
            finally:
                with self._cond:
                    self._running[job.key] -= 1
                    if not self._running[job.key]:
                        del self._running[job.key]
                    self._cond.notify_all()

    def _pool(self, lane: int) -> ProcessPoolExecutor:
        """The lane's pool, started (and its worker asked for its pid) on first use."""
        with self._pools_lock:
            pool = self._pools[lane]
            if pool is None:
                context = multiprocessing.get_context("forkserver")
                if self._preload:
                    context.set_forkserver_preload(self._preload)
                pool = ProcessPoolExecutor(1, mp_context=context, initializer=self._initializer,
                                           initargs=self._initargs)
                self._pools[lane] = pool
                self._pids[lane] = pool.submit(_pid)
            return pool

    def _pid_of(self, lane: int) -> int | None:
        with self._pools_lock:
            asked = self._pids[lane]
        return asked.result() if asked is not None else None

    def _replace(self, lane: int) -> None:
        with self._pools_lock:
            pool, self._pools[lane], self._pids[lane] = self._pools[lane], None, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _run(self, lane: int, job: _Job[Any]) -> None:
        try:
            pool = self._pool(lane)
            pid = self._pid_of(lane)
            running = pool.submit(job.fn, *job.args)
            start = _cpu_seconds(pid) if pid is not None else None
            while True:
                try:
                    job.future.set_result(running.result(timeout=_POLL_S))
                    return
                except FutureTimeout:
                    pass
                if pid is None or start is None or job.cpu_s is None:
                    continue
                used = _cpu_seconds(pid)
                if used is not None and used - start > job.cpu_s + _GRACE_S:
                    os.kill(pid, signal.SIGKILL)
                    self._replace(lane)
                    job.future.set_exception(LaneKilled(job.cpu_s))
                    return
        except BrokenProcessPool as exc:
            self._replace(lane)
            job.future.set_exception(exc)
        except BaseException as exc:  # noqa: BLE001 (the job's own error is the caller's)
            job.future.set_exception(exc)
