"""Real Prefect API servers for tests: ``prefect server start`` on SQLite or on a PostgreSQL that
the test starts itself (Debian's postgresql 15, initdb + pg_ctl, no system service).

Each server gets a temp PREFECT_HOME, analytics off, a free port and the UI told its API URL
(``PREFECT_SERVER_UI_API_URL``; ``--port`` alone leaves the UI pointing at :4200). A program that
is missing makes the fixture fail, never skip. Usage::

    with postgres_database(tmp) as url, prefect_server(tmp, database_url=url) as server:
        run_flow_process(server, "flows.replay:replay", {...})
"""

from __future__ import annotations

import json
import os
import shutil
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

__all__ = ["PG_BIN", "PrefectServer", "free_port", "postgres_database", "prefect_server",
           "prefect_env", "psql", "flow_run", "wait_for_flow_run"]

PG_BIN = Path("/usr/lib/postgresql/15/bin")
ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    """A port the kernel just handed out (bind to 0), free for the server to take."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class PrefectServer:
    """A running ``prefect server start``."""

    url: str
    home: Path
    log: Path

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    def env(self) -> dict[str, str]:
        """Environment for a process (flow, worker, serve) that talks to this server."""
        return prefect_env(self.home, api_url=self.api_url)


def prefect_env(home: Path, *, api_url: str | None = None, **extra: str) -> dict[str, str]:
    """A clean Prefect environment rooted at ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "DO_NOT_TRACK": "1", "PREFECT_LOGGING_LEVEL": "INFO",
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    if api_url is not None:
        env["PREFECT_API_URL"] = api_url
    env.update(extra)
    return env


@contextmanager
def prefect_server(workdir: Path, *, database_url: str | None = None,
                   startup_timeout: float = 120.0) -> Iterator[PrefectServer]:
    """Start ``prefect server start`` on a free port and wait until ``/api/health`` answers."""
    prefect = VENV_BIN / "prefect"
    if not prefect.exists():
        raise RuntimeError(f"{prefect} is missing: run `make setup`")
    home = workdir / "prefect-home"
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    database = database_url or f"sqlite+aiosqlite:///{home / 'prefect.db'}"
    env = prefect_env(home, PREFECT_SERVER_UI_API_URL=f"{url}/api",
                      PREFECT_API_DATABASE_CONNECTION_URL=database)
    log = workdir / "prefect-server.log"
    with log.open("wb") as out:
        process = subprocess.Popen([str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                   env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(url, process, log, startup_timeout)
        yield PrefectServer(url=url, home=home, log=log)
    finally:
        _stop(process)


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prefect server exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/api/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"prefect server at {url} not healthy after {timeout} s:\n{log.read_text()[-4000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the server's whole process group (uvicorn and its services)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@contextmanager
def postgres_database(name: str = "prefect", startup_timeout: float = 60.0) -> Iterator[str]:
    """A fresh PostgreSQL cluster on a free port; yields an asyncpg URL to database ``name``.

    As root, PostgreSQL runs as the ``postgres`` user (initdb refuses root), so its folder is a
    fresh one under /tmp owned by that user (pytest's tmp_path is private to root).
    """
    for program in ("initdb", "pg_ctl", "psql"):
        if not (PG_BIN / program).exists():
            raise RuntimeError(f"{PG_BIN / program} is missing: run scripts/install_system_deps.sh")
    as_root = os.geteuid() == 0
    base = Path(tempfile.mkdtemp(prefix="denpex-pg-"))
    if as_root:
        shutil.chown(base, user="postgres")
    data, port = base / "data", free_port()

    def run(*argv: str) -> None:
        command = list(argv)
        if as_root:
            command = ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(command)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=startup_timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stdout}{done.stderr}")

    run(str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-t", str(int(startup_timeout)), "-l", str(base / "log"),
        "-o", f"-p {port} -k {base} -c listen_addresses=127.0.0.1", "start")
    try:
        run(str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
            "-c", f"create database {name}")
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/{name}"
    finally:
        run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


def psql(database_url: str, sql: str) -> str:
    """Run one SQL statement against the database of ``postgres_database``; its output, unaligned."""
    port = database_url.rsplit(":", 1)[1].split("/")[0]
    name = database_url.rsplit("/", 1)[1]
    command = [str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-d", name, "-tAc", sql]
    if os.geteuid() == 0:
        command = ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(command)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"psql failed ({done.returncode}): {done.stderr}")
    return done.stdout.strip()


def flow_run(server: PrefectServer, flow_run_id: str) -> dict[str, Any]:
    """The flow run as the REST API returns it."""
    response = httpx.get(f"{server.api_url}/flow_runs/{flow_run_id}", timeout=10)
    response.raise_for_status()
    return dict(response.json())


def wait_for_flow_run(server: PrefectServer, flow_run_id: str, states: set[str],
                      timeout: float = 120.0) -> dict[str, Any]:
    """Poll until the run's state type is one of ``states`` (e.g. {"PAUSED"})."""
    deadline = time.monotonic() + timeout
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = flow_run(server, flow_run_id)
        if run.get("state_type") in states:
            return run
        time.sleep(0.5)
    raise TimeoutError(f"flow run {flow_run_id} still {run.get('state_type')} after {timeout} s: "
                       f"{json.dumps(run.get('state'))[:500]}")
