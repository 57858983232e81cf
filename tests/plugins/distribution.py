"""Which tests must share a pytest-xdist worker (``--dist loadgroup``).

Every worker is its own pytest session, so a session or module fixture runs once per worker that
needs it. Tests that share an expensive fixture (a Prefect server, a real Gloo run, a generated
dump set) are given one ``xdist_group`` so that the fixture starts once; every other test goes to
whichever worker is free. The rule is read off the fixtures each test asks for, so a new test that
uses one of them lands in its group without a mark of its own.
"""

from __future__ import annotations

import pytest

# Session fixtures that start real services or real multi-process runs, by the group they pin.
# Tests that ask for any of a group's fixtures share that group's worker.
SHARED_SESSION_FIXTURES: dict[str, str] = {
    # The Prefect test-harness server and what is served against it (tests/plugins/services.py,
    # tests/flows/conftest.py): the flow tests, the replay flow and the Dask fan-out.
    "prefect_harness": "prefect-harness",
    "prefect_api": "prefect-harness",
    "flow_rig": "prefect-harness",
    # `prefect server start` on PostgreSQL, the flows served against it, the UI test.
    "postgres_prefect": "prefect-postgres",
    # `prefect server start` on SQLite.
    "sqlite_prefect": "prefect-sqlite",
    # The ingest tests' Prefect server with the probe deployment served.
    "engine": "ingest-engine",
    # The real Gloo runs (minutes of real processes each).
    "generated": "gloo-scenarios",
    "live": "gloo-cases",
}

def group_of(item: pytest.Item) -> str | None:
    """The worker group a test must share, or None when any worker may run it."""
    names = set(getattr(item, "fixturenames", ()))
    for fixture, group in SHARED_SESSION_FIXTURES.items():
        if fixture in names:
            return group
    if _uses_own_module_fixture(item):
        # A module fixture (a server started for one file) would start again on every worker
        # that runs one of the file's tests.
        return item.nodeid.split("::", 1)[0]
    return None


def _uses_own_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name, defs in info.name2fixturedefs.items():
        if name not in item.fixturenames or not defs:
            continue
        fixture = defs[-1]
        # A plugin's fixture (anyio_backend) has no base id: only the suite's own count.
        if fixture.scope == "module" and fixture.baseid:
            return True
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
