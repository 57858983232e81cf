"""The environment each test gets: Prefect pointed at a private home for the whole session (set
before any test module imports Prefect, undone when the session ends), fast polling for every
runner and worker a test serves, and each test's own changes to ``os.environ`` undone after it
(httpx's ``clean_environ`` habit), so that no test leaks settings into the next.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Prefect reads these when it is imported, and test modules import it at collection.
# Runners and workers poll every 10 s by default: 1 s lets a served run start within a second.
SESSION_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # a telemetry insert otherwise hit "database is locked"
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_RUNNER_POLL_FREQUENCY": "1",
    "PREFECT_WORKER_QUERY_SECONDS": "1",
}

_BEFORE_SESSION = pytest.StashKey[dict[str, str]]()
_PREFECT_HOME = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_BEFORE_SESSION] = dict(os.environ)
    home = config.stash[_PREFECT_HOME] = Path(tempfile.mkdtemp(prefix="denpex-prefect-home-"))
    os.environ.update(SESSION_ENV, PREFECT_HOME=str(home))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _BEFORE_SESSION in config.stash:
        os.environ.clear()
        os.environ.update(config.stash[_BEFORE_SESSION])
    if _PREFECT_HOME in config.stash:
        shutil.rmtree(config.stash[_PREFECT_HOME], ignore_errors=True)


@pytest.fixture(autouse=True)
def clean_environ() -> Iterator[None]:
    """Undo what the test changed in ``os.environ`` (session fixtures set theirs up before it)."""
    before = dict(os.environ)
    yield
    current = os.environ.get("PYTEST_CURRENT_TEST")
    os.environ.clear()
    os.environ.update(before)
    if current is not None:
        os.environ["PYTEST_CURRENT_TEST"] = current
