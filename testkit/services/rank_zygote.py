"""Real rank processes without paying for ``import torch`` in each: one process (the zygote)
imports torch and the collector once, then forks every rank the generators launch.

A rank of a generated Gloo job spent about 5.5 CPU-seconds before it did its part: 3.3 importing
torch and the collector, 2.2 in its first Flight Recorder dump, which symbolizes C++ frames and
first parses libtorch's symbols. The suite starts over a hundred ranks. The zygote pays both
once: it imports, and it symbolizes one C++ traceback so that the parsed symbols are in memory
when it forks (a forked rank's first dump then takes a millisecond, measured). A forked rank is
as real as a launched one: its own process and session, its own Gloo process group and Flight
Recorder, its own dump. What it shares with its siblings is memory from before the fork.

    launcher = rank_launcher()            # one zygote per process, started on first use
    proc = launcher.spawn("testkit.generators.gloo_worker", ["--rank", "0", ...],
                          env=env, cwd=root, log=work / "rank_0.log")
    proc.poll(); os.killpg(proc.pid, signal.SIGKILL); proc.wait()

The zygote forks only from its single thread, before any process group exists (a fork after
Gloo started its threads would copy locks held by them). It exits once its parent is gone, and
each rank has the kernel kill it when the zygote dies (``--parent-pid launcher.pid``), so nothing
outlives the test session.

Run as ``python -m testkit.services.rank_zygote SOCKET PARENT_PID``; :func:`rank_launcher` does.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["RankLauncher", "RankProcess", "rank_launcher"]

ROOT = Path(__file__).resolve().parents[2]

# What every generated rank imports before it runs: paid once, in the zygote.
PRELOAD = ("torch", "torch.distributed", "denpex.collector", "testkit.generators.gloo_worker",
           "testkit.generators.gloo_case_worker", "testkit.generators.stacks_worker")

# The ranks run single-threaded math (the generators set it too); the zygote must not start an
# OpenMP pool before it forks.
ZYGOTE_ENV = {"OMP_NUM_THREADS": "1"}


class RankProcess:
    """A rank forked by the zygote: the part of ``subprocess.Popen`` the generators use.

    The rank is the zygote's child, not ours, so its exit status comes from the zygote."""

    def __init__(self, launcher: RankLauncher, pid: int, args: list[str]) -> None:
        self._launcher = launcher
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._launcher.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.02)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class RankLauncher:
    """The client side: starts the zygote and asks it to fork ranks (thread-safe)."""

    def __init__(self, startup_timeout_s: float = 180.0) -> None:
        self._folder = Path(tempfile.mkdtemp(prefix="denpex-zygote-"))
        self._socket = self._folder / "zygote.sock"
        self._lock = threading.Lock()
        env = {**os.environ, **ZYGOTE_ENV,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self._proc = subprocess.Popen([sys.executable, "-m", "testkit.services.rank_zygote", str(self._socket),
                                       str(os.getpid())], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        ready = self._read_ready(startup_timeout_s)
        if ready != "ready":
            self.stop()
            raise RuntimeError(f"the rank zygote did not start: {ready}")

    @property
    def pid(self) -> int:
        """The zygote's pid: the parent each forked rank must outlive no longer than."""
        return self._proc.pid

    def spawn(self, module: str, args: Sequence[str], *, env: Mapping[str, str], cwd: Path,
              log: Path) -> RankProcess:
        """Fork ``python -m module *args`` in a session of its own, output to ``log``."""
        return self._spawn({"module": module}, module, args, env, cwd, log)

    def spawn_script(self, script: Path, args: Sequence[str], *, env: Mapping[str, str], cwd: Path,
                     log: Path) -> RankProcess:
        """Fork ``python script *args`` in a session of its own, output to ``log``."""
        return self._spawn({"script": str(script)}, str(script), args, env, cwd, log)

    def _spawn(self, target: dict[str, str], name: str, args: Sequence[str], env: Mapping[str, str], cwd: Path,
               log: Path) -> RankProcess:
        answer = self._ask({"op": "spawn", **target, "args": list(args), "env": dict(env),
                            "cwd": str(cwd), "log": str(log)})
        return RankProcess(self, int(answer["pid"]), [name, *args])

    def returncode(self, pid: int) -> int | None:
        code = self._ask({"op": "poll", "pid": pid})["returncode"]
        return None if code is None else int(code)

    def alive(self) -> bool:
        return self._proc.poll() is None

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait(timeout=30)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._socket.unlink(missing_ok=True)
        try:
            self._folder.rmdir()
        except OSError:
            pass

    def _read_ready(self, timeout_s: float) -> str:
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        seen = b""
        while time.monotonic() < deadline:
            readable, _, _ = select.select([self._proc.stdout], [], [], 1.0)
            if readable:
                chunk = os.read(self._proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                seen += chunk
                if b"ready\n" in seen:
                    return "ready"
            elif self._proc.poll() is not None:
                break
        return seen.decode(errors="replace")[-2000:] or "no answer within the start-up timeout"

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(60)
            conn.connect(str(self._socket))
            conn.sendall(json.dumps(request).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    raise RuntimeError(f"the rank zygote closed the connection on {request['op']}")
                data += chunk
        answer: dict[str, Any] = json.loads(data)
        if "error" in answer:
            raise RuntimeError(f"the rank zygote refused {request['op']}: {answer['error']}")
        return answer


_LAUNCHER: RankLauncher | None = None
_LAUNCHER_LOCK = threading.Lock()


def rank_launcher() -> RankLauncher:
    """This process's zygote, started on first use and stopped when the process exits."""
    global _LAUNCHER
    with _LAUNCHER_LOCK:
        if _LAUNCHER is None or not _LAUNCHER.alive():
            _LAUNCHER = RankLauncher()
            atexit.register(_LAUNCHER.stop)
        return _LAUNCHER


# --- the zygote itself -------------------------------------------------------------------------


def _serve(path: str, parent_pid: int) -> None:
    for module in PRELOAD:
        __import__(module)
    from torch.utils._traceback import CapturedTraceback

    # Flight Recorder's first dump symbolizes C++ frames: parse libtorch's symbols once, here.
    CapturedTraceback.format_all([CapturedTraceback.extract(cpp=True)])
    exits: dict[int, int] = {}
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    print("ready", flush=True)
    while os.getppid() == parent_pid:  # reparented: the session is gone, and so are we
        _reap(exits)
        readable, _, _ = select.select([server], [], [], 0.05)
        if not readable:
            continue
        conn, _ = server.accept()
        with conn:
            try:
                request = json.loads(_read_line(conn))
                answer = _handle(request, exits, server, conn)
            except Exception as exc:  # noqa: BLE001 (the client gets the error, the zygote lives on)
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            conn.sendall(json.dumps(answer).encode() + b"\n")
    # Parent gone: take every rank with us (each also dies with us through PDEATHSIG).
    for pid in list(_children()):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _handle(request: dict[str, Any], exits: dict[int, int], server: socket.socket,
            conn: socket.socket) -> dict[str, Any]:
    if request["op"] == "poll":
        _reap(exits)
        return {"returncode": exits.get(int(request["pid"]))}
    if request["op"] == "spawn":
        pid = os.fork()
        if pid == 0:
            server.close()
            conn.close()
            _become_rank(request)  # never returns
        return {"pid": pid}
    raise ValueError(f"unknown op {request['op']!r}")


def _become_rank(request: dict[str, Any]) -> None:
    """In the forked child: a session of its own, the rank's environment, output and argv; run it."""
    import runpy
    import traceback

    code = 1
    try:
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        try:
            if "script" in request:
                sys.argv = [request["script"], *request["args"]]
                sys.path[0] = str(Path(request["script"]).parent)  # as `python script` puts it
                runpy.run_path(request["script"], run_name="__main__")
            else:
                sys.argv = [request["module"], *request["args"]]
                runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 (a rank's crash is its log's business)
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(exits: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exits[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _children() -> list[int]:
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.append(int(entry.name))
    return found


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
