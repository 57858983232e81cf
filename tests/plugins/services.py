"""The real services that several test folders share, each started once per pytest session.

Under pytest-xdist every worker is a session of its own: ``plugins/distribution.py`` sends the
tests that use one of these fixtures to one worker, so each starts once in the whole run. What a
test leaves on a shared server must not reach another test: each test names its own incidents,
deployments stay those of the one process that serves them, and a test that deploys names of
its own (``prefect deploy --all``) uses a server that no served deployment listens on.

- ``prefect_harness``: Prefect's own test harness (SQLite), the in-process engine of the flow
  tests, the replay flow and the Dask fan-out.
- ``sqlite_prefect``: ``prefect server start`` on SQLite behind basic authentication, as production
  puts the API: where SQLite itself is under test, where ``prefect deploy --all`` and a process
  worker run, and where the ingest trigger must send the auth string.
- ``postgres_prefect``: ``prefect server start`` on a PostgreSQL the session starts, as in
  production: the served flows, the UI approval in Chromium, the stored rows.
- ``slurm_lab``: munged, slurmctld, 16 slurmd and sshd on loopback; ``lab`` is it reset for a test.
"""

from __future__ import annotations

import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from denpex.isolation.ssh import Backoff, SshSettings
from testkit.services.postgres import postgres_database
from testkit.services.prefect import PrefectServer, prefect_server
from testkit.services.slurm import SlurmLab


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[str]:
    """The API URL of ``prefect_test_harness``, which this process's Prefect client now uses."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield str(PREFECT_API_URL.value())


@pytest.fixture(scope="session")
def sqlite_prefect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """Every client of it sends ``server.auth_string`` (``server.env()``, ``server.headers``)."""
    with prefect_server(tmp_path_factory.mktemp("prefect-sqlite"), auth_string=f"ops:{secrets.token_urlsafe(12)}") as server:
        yield server


@dataclass(frozen=True)
class PostgresPrefect:
    """A ``prefect server start`` and the PostgreSQL database it stores everything in."""

    server: PrefectServer
    database_url: str


@pytest.fixture(scope="session")
def postgres_prefect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresPrefect]:
    work = tmp_path_factory.mktemp("prefect-postgres")
    with postgres_database() as url, prefect_server(work, database_url=url) as server:
        yield PostgresPrefect(server, url)


@pytest.fixture(scope="session")
def slurm_lab() -> Iterator[SlurmLab]:
    # Not pytest's tmp_path: munged needs execute-for-all on every folder above its socket, and
    # the socket path must stay short.
    root = Path(tempfile.mkdtemp(prefix="denpex-lab-"))
    lab = SlurmLab(root)
    try:
        lab.start()
        yield lab
    finally:
        lab.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def lab(slurm_lab: SlurmLab) -> SlurmLab:
    """The session's lab with no jobs, no drains and no features left by an earlier test."""
    slurm_lab.reset_nodes()
    return slurm_lab


@pytest.fixture
def ssh_settings(lab: SlurmLab) -> SshSettings:
    return SshSettings(
        host="127.0.0.1", port=lab.ssh_port, username="root", key_path=lab.client_key,
        known_hosts=lab.known_hosts, connect_timeout_s=5, command_timeout_s=20,
        backoff=Backoff(attempts=4, initial_s=0.05, max_s=0.2),
    )
