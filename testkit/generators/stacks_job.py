"""Launch a real Gloo job of :mod:`testkit.generators.stacks_worker` ranks, each in a known place.

    with StacksJob(tmp, roles=["collective", "collective", "sleep", "collective"]) as job:
        job.wait_for(lambda: len(job.records()) == 4, timeout_s=90)

Each rank runs in its own session, so that closing the job kills the rank and whatever it forked
(torch's debug server frontend) with one signal per rank; the py-spy sidecars run in sessions of
their own and exit once their rank is gone.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from testkit.services.net import free_port
from testkit.services.rank_zygote import RankProcess, rank_launcher

__all__ = ["StacksJob"]


class StacksJob:
    """``len(roles)`` ranks; ``work`` holds ``collected/`` (the dumps), ``markers/``, ``debug/``, logs."""

    def __init__(self, work: Path, roles: Sequence[str], *, timeout_s: float = 6.0, trigger_fraction: float = 0.75,
                 sidecar_deadline_s: float | None = None, debug_server: bool = False) -> None:
        """``timeout_s`` is the collective timeout; the dumps come at ``trigger_fraction`` of it.

        When the timeout passes, Gloo counts the failed collective as completed; the dumper knows
        the op's deadline and keeps the hang's dump (no ``recovered`` one), but a rank that then
        exits leaves the folder as it was only until the job is torn down: take the files while
        the ranks still hang (:meth:`snapshot`), or give the timeout room."""
        self.work = work
        self.roles = list(roles)
        self.collected = work / "collected"
        self.debug_dir = work / "debug"
        self._timeout_s = timeout_s
        self._fraction = trigger_fraction
        self._sidecar = sidecar_deadline_s
        self._debug = debug_server
        self.procs: list[RankProcess] = []

    def __enter__(self) -> StacksJob:
        self.work.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
               "WORLD_SIZE": str(len(self.roles))}
        debug_port = free_port() if self._debug else None
        launcher = rank_launcher()
        for rank, role in enumerate(self.roles):
            args = ["--rank", str(rank), "--world-size", str(len(self.roles)), "--work-dir", str(self.work),
                    "--role", role, "--timeout-s", str(self._timeout_s), "--trigger-fraction", str(self._fraction),
                    "--parent-pid", str(launcher.pid)]
            if self._sidecar is not None:
                args += ["--sidecar-deadline-s", str(self._sidecar)]
            if debug_port is not None:
                args += ["--debug-port", str(debug_port)]
            # Forked from the zygote (torch imported, symbols parsed), each rank in a session of its own.
            self.procs.append(launcher.spawn("testkit.generators.stacks_worker", args,
                                             env={**env, "RANK": str(rank)}, cwd=Path.cwd(),
                                             log=self.work / f"rank-{rank}.log"))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """SIGKILL every rank's session and reap the ranks."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            proc.wait(timeout=30)

    def snapshot(self, to: Path) -> Path:
        """A copy of the dump folder as it is now (hidden temporary files left out)."""
        shutil.copytree(self.collected, to, ignore=shutil.ignore_patterns(".*"))
        return to

    def records(self) -> list[Path]:
        """The dump records written so far (one per rank that dumped)."""
        return sorted((self.collected / "collector").glob("rank_*.record.json"))

    def wait_for(self, done: Callable[[], bool], *, timeout_s: float, what: str = "the job") -> None:
        """Poll ``done`` until true; fail with the ranks' log tails if time runs out or a rank exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if done():
                return
            exited = {r: p.returncode for r, p in enumerate(self.procs) if p.poll() is not None}
            if exited:
                raise AssertionError(f"ranks exited {exited} while waiting for {what}:\n{self.log_tails()}")
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}:\n{self.log_tails()}")

    def log_tails(self, lines: int = 15) -> str:
        """The end of every rank's (and sidecar's) log."""
        out = []
        for log in sorted(self.work.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(out)
