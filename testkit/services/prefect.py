"""Real Prefect API servers: ``prefect server start`` on SQLite, or on a PostgreSQL from
:mod:`testkit.services.postgres`, and the helpers that wait on what runs against them.

Each server gets a temp PREFECT_HOME, analytics off, a free port and the UI told its API URL
(``PREFECT_SERVER_UI_API_URL``; ``--port`` alone leaves the UI pointing at :4200). A program that
is missing makes the caller fail, never skip. Usage::

    with postgres_database() as url, prefect_server(tmp, database_url=url) as server:
        run_flow_process(server, "flows.replay:replay", {...})

or, where the server outlives one block (a session fixture)::

    server = PrefectServer(tmp)
    server.start()
    ...
    server.stop()
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from denpex.ingest.alert_event import api_headers
from testkit.services.net import free_port, log_tail, wait_http
from testkit.services.process_group import stop_process_group

__all__ = ["PrefectServer", "prefect_server", "prefect_env", "flow_run", "wait_for_flow_run",
           "wait_for_deployments", "run_url_through_login"]

ROOT = Path(__file__).resolve().parents[2]


def run_url_through_login(ui_url: str, run_id: object) -> str:
    """The address of a flow run that opens in a browser not yet logged in to a UI behind basic
    authentication: the UI's login page, sent on to the run. The run's own address shows "Page not
    found" there (Prefect 3's UI offers its login only on the way in), and its login page ignores
    a ``redirectTo`` outside its ``/v2`` paths."""
    from urllib.parse import quote

    return f"{ui_url.rstrip('/')}/v2/login?redirectTo={quote(f'/runs/flow-run/{run_id}', safe='')}"


def prefect_env(home: Path, *, api_url: str | None = None, **extra: str) -> dict[str, str]:
    """A clean Prefect environment rooted at ``home``: this process's environment without its
    ``PREFECT_*`` settings, analytics off, the repository root on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    # Runners and workers poll every 10 s by default; 1 s lets a served or queued run start
    # within a second of being created, which is what every wait in the tests is waiting for.
    env.update({"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "DO_NOT_TRACK": "1", "PREFECT_LOGGING_LEVEL": "INFO",
                "PREFECT_RUNNER_POLL_FREQUENCY": "1", "PREFECT_WORKER_QUERY_SECONDS": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    if api_url is not None:
        env["PREFECT_API_URL"] = api_url
    env.update(extra)
    return env


class PrefectServer:
    """``prefect server start`` on a free port, its PREFECT_HOME ``workdir/prefect-home`` and its
    output in ``workdir/prefect-server.log``.

    ``start()`` returns once ``/api/health`` answers; ``stop()`` ends the server's whole process
    group. ``database_url`` is SQLAlchemy's (SQLite in the home by default); ``ui=False`` leaves
    the UI out (a quicker start where nobody looks at it).
    """

    def __init__(self, workdir: Path, *, database_url: str | None = None, ui: bool = True,
                 startup_timeout: float = 120.0, auth_string: str | None = None) -> None:
        self.home = workdir / "prefect-home"
        self.log = workdir / "prefect-server.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.database_url = database_url or f"sqlite+aiosqlite:///{self.home / 'prefect.db'}"
        self.ui = ui
        self.startup_timeout = startup_timeout
        self.auth_string = auth_string
        """``user:password``: the API answers 401 without it (``PREFECT_SERVER_API_AUTH_STRING``)."""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a process (flow, worker, serve) that talks to this server."""
        auth = {"PREFECT_API_AUTH_STRING": self.auth_string} if self.auth_string else {}
        return prefect_env(self.home, api_url=self.api_url, **auth, **extra)

    @property
    def headers(self) -> dict[str, str]:
        """What a plain HTTP client sends to this server's API."""
        return api_headers(self.auth_string)

    def start(self) -> None:
        # `python -m prefect`, not the venv's console script: a clone's venv that borrows this
        # one's packages (the demo test) has the module but not the script.
        self.home.mkdir(parents=True, exist_ok=True)
        env = prefect_env(self.home, PREFECT_SERVER_UI_API_URL=self.api_url,
                          PREFECT_API_DATABASE_CONNECTION_URL=self.database_url)
        if not self.ui:
            env["PREFECT_UI_ENABLED"] = "false"
        if self.auth_string:
            env["PREFECT_SERVER_API_AUTH_STRING"] = self.auth_string
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_http(f"{self.api_url}/health", self.startup_timeout, self.process, self.log, interval_s=0.5)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server's whole process group (uvicorn and its services)."""
        process, self.process = self.process, None
        if process is not None:
            stop_process_group(process)


@contextmanager
def prefect_server(workdir: Path, *, database_url: str | None = None, ui: bool = True, auth_string: str | None = None,
                   startup_timeout: float = 120.0) -> Iterator[PrefectServer]:
    """A :class:`PrefectServer` started for the block and stopped after it."""
    server = PrefectServer(workdir, database_url=database_url, ui=ui, startup_timeout=startup_timeout,
                           auth_string=auth_string)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def wait_for_deployments(api_url: str, names: Collection[str], process: subprocess.Popen[bytes], log: Path,
                         timeout: float = 180.0, *, automations: Collection[str] = (),
                         headers: dict[str, str] | None = None) -> None:
    """Wait until the server at ``api_url`` lists every deployment in ``names`` and every
    automation (a deployment's trigger) in ``automations``: an event sent before its trigger
    exists starts nothing. ``process`` serves them (its output in ``log``); its exit fails the wait.
    """
    wanted, triggers = set(names), set(automations)
    deadline = time.monotonic() + timeout
    # One client for the whole wait: each new one builds an SSL context (tens of ms of CPU), and
    # this polls twice a second for up to minutes.
    with httpx.Client(timeout=10, headers=headers) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{_command(process)} exited {process.returncode}:\n{log_tail(log)}")
            found = client.post(f"{api_url}/deployments/filter",
                                json={"deployments": {"name": {"any_": sorted(wanted)}}}).json()
            registered = client.post(f"{api_url}/automations/filter", json={}).json() if triggers else []
            if wanted <= {d["name"] for d in found} and triggers <= {a["name"] for a in registered}:
                return
            time.sleep(0.5)
    raise RuntimeError(f"deployments {sorted(wanted)} (automations {sorted(triggers)}) were not served "
                       f"within {timeout} s by {_command(process)}:\n{log_tail(log)}")


def flow_run(server: PrefectServer, flow_run_id: str) -> dict[str, Any]:
    """The flow run as the REST API returns it."""
    response = httpx.get(f"{server.api_url}/flow_runs/{flow_run_id}", timeout=10, headers=server.headers)
    response.raise_for_status()
    return dict(response.json())


def wait_for_flow_run(server: PrefectServer, flow_run_id: str, states: set[str],
                      timeout: float = 120.0) -> dict[str, Any]:
    """Poll until the run's state type is one of ``states`` (e.g. {"PAUSED"})."""
    deadline = time.monotonic() + timeout
    run: dict[str, Any] = {}
    with httpx.Client(timeout=10, headers=server.headers) as client:  # one SSL context for the wait
        while time.monotonic() < deadline:
            response = client.get(f"{server.api_url}/flow_runs/{flow_run_id}")
            response.raise_for_status()
            run = dict(response.json())
            if run.get("state_type") in states:
                return run
            time.sleep(0.5)
    raise TimeoutError(f"flow run {flow_run_id} still {run.get('state_type')} after {timeout} s: "
                       f"{json.dumps(run.get('state'))[:500]}")


def _command(process: subprocess.Popen[bytes]) -> str:
    """The process's command line, for an error message."""
    args = process.args
    words = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
    return "`" + " ".join(os.fsdecode(word) for word in words) + "`"

