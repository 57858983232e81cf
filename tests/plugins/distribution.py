"""Which tests must share a pytest-xdist worker, and the scheduler that keeps them together.

Every worker is its own pytest session, so a session or module fixture runs once per worker that
needs it. Tests that share an expensive fixture (a Prefect server, a real Gloo run, a generated
dump set) are given one group, so that the fixture starts once in the whole run; every other test
goes to whichever worker is free. The rule is read off the fixtures each test asks for, so a new
test that uses one of them lands in its group without a mark of its own.

Why not xdist's own ``xdist_group`` marks: pytest-xdist 3.8 groups by appending ``@group`` to
``item._nodeid``, which pytest 9.2 no longer reads (a node's id is ``item._id``), so marked tests
were spread over every worker. Here each worker writes the groups it computed to a file named
by the controller (``workerinput``), and the controller's scheduler reads them; nothing depends on
node ids being rewritten. ``--dist loadgroup`` turns it on.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

# Session fixtures that start real services or real multi-process runs, by the group they pin.
# Tests that ask for any of a group's fixtures share that group's worker.
SHARED_SESSION_FIXTURES: dict[str, str] = {
    # The Prefect test-harness server and what is served against it (tests/plugins/services.py,
    # tests/flows/conftest.py): the flow tests, the replay flow and the Dask fan-out. A test's
    # fixture names include what its fixtures use (flow_rig -> prefect_api -> prefect_harness).
    "prefect_harness": "prefect-harness",
    # `prefect server start` on PostgreSQL, the flows served against it, the UI test.
    "postgres_prefect": "prefect-postgres",
    # `prefect server start` on SQLite.
    "sqlite_prefect": "prefect-sqlite",
    # The ingest tests' Prefect server with the probe deployment served.
    "engine": "ingest-engine",
    # The real Gloo runs (minutes of real processes each).
    "generated": "gloo-scenarios",
    "live": "gloo-cases",
    # Last: the Slurm lab's other users (the isolation tests) share one worker, so that a run
    # starts one lab for them and one each for the flow tests on the harness and on PostgreSQL,
    # not one on every worker.
    "slurm_lab": "slurm-lab",
}

# A group whose tests together run far longer than a worker's share of the suite is split into
# lanes: each lane is a group of its own, on a worker of its own, and starts the group's fixtures
# again there. The harness group's flow tests ran 490 s one after another while the other three
# workers were done at 400 s; two lanes of about 250 s each cost one more harness, flow rig and
# Slurm lab (about 30 s of CPU). Modules listed here run in the group's second lane.
SECOND_LANE: dict[str, frozenset[str]] = {
    "prefect-harness": frozenset({
        "tests/flows/test_triage_flow.py",
        "tests/flows/test_demo_folders.py",
        "tests/flows/test_forked_runs.py",
        "tests/flows/test_incident_flow.py",
        "tests/flows/test_k8s_dead_rank_flow.py",
        "tests/flows/test_recovery.py",
        "tests/flows/test_requeue_flow.py",
    }),
}
_LANE_MARK = "#2"

# Scopes that take minutes are sent first, longest first, each to a worker of its own, so that
# the two thousand short tests fill the other workers around them; sent by test count (xdist's
# order), a long group or a whole-demo test could start last and run on alone. By prefix.
LONG_FIRST: tuple[str, ...] = (
    "prefect-harness" + _LANE_MARK,
    "prefect-harness",
    "prefect-postgres",
    "ingest-engine",
    "slurm-lab",
    "prefect-sqlite",
    "tests/flows/test_demo.py::",
    "tests/flows/test_demo_signals.py::",
    "gloo-scenarios",
    "gloo-cases",
)

_GROUPS_DIR = "denpex_groups_dir"
_GROUPS_KEY = pytest.StashKey[Path]()
_GROUP = pytest.StashKey[str]()


def group_of(item: pytest.Item) -> str | None:
    """The worker group a test must share, or None when any worker may run it."""
    names = set(getattr(item, "fixturenames", ()))
    for fixture, group in SHARED_SESSION_FIXTURES.items():
        if fixture in names:
            module = item.nodeid.split("::", 1)[0]
            return group + _LANE_MARK if module in SECOND_LANE.get(group, ()) else group
    if _uses_own_module_fixture(item):
        # A module fixture (a server started for one file) would start again on every worker
        # that runs one of the file's tests.
        return item.nodeid.split("::", 1)[0]
    return None


def long_scopes_first(scopes: set[str]) -> list[str]:
    """The scopes that ``LONG_FIRST`` names (by prefix), in its order; the others are left out."""
    ordered: list[str] = []
    for prefix in LONG_FIRST:
        ordered += sorted(scope for scope in scopes if scope.startswith(prefix) and scope not in ordered)
    return ordered


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


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") == "loadgroup":
        config.stash[_GROUPS_KEY] = Path(tempfile.mkdtemp(prefix="denpex-xdist-groups-"))



@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Controller: tell each worker where to write its groups (only under ``--dist loadgroup``)."""
    if _GROUPS_KEY in node.config.stash:
        node.workerinput[_GROUPS_DIR] = str(node.config.stash[_GROUPS_KEY])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Worker: note each test's group and write the groups for the controller."""
    groups = {}
    for item in items:
        group = group_of(item)
        if group is not None:
            item.stash[_GROUP] = group
            groups[item.nodeid] = group
    folder = getattr(config, "workerinput", {}).get(_GROUPS_DIR)
    if folder:
        worker = config.workerinput["workerid"]
        path = Path(folder) / f"{worker}.json"
        path.with_suffix(".tmp").write_text(json.dumps(groups))
        path.with_suffix(".tmp").replace(path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if _GROUPS_KEY not in config.stash:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """LoadScope with each test's scope its group, or the test itself when it has none.
        Scopes named in ``LONG_FIRST`` are sent first, in its order; the rest largest first
        (xdist's default ``--loadscope-reorder``)."""

        _groups: dict[str, str] | None = None

        def schedule(self) -> None:
            collections = ({tuple(items) for items in self.registered_collections.values()}
                           if self.collection is None else set())
            if len(collections) == 1:
                # xdist fills its work queue in place (``workqueue[scope] = tests``), so scopes put
                # there first keep their place; only scopes that were collected are put there, and
                # only when xdist goes on to fill them (it stops when the workers' collections
                # differ, and an empty scope left queued would keep the run waiting for ever).
                [collected] = collections
                for scope in long_scopes_first({self._split_scope(nodeid) for nodeid in collected}):
                    self.workqueue[scope] = {}
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                # Read once the workers have all reported their collection (schedule() runs then).
                self._groups = {}
                for path in sorted(config.stash[_GROUPS_KEY].glob("*.json")):
                    self._groups.update(json.loads(path.read_text()))
            return self._groups.get(nodeid, nodeid)

    return SharedFixtureScheduling(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Worker: stop a group's servers after its last test instead of at the end of the session.

    A group's tests run one after another on one worker, so when the next test is not of the
    group none of this worker's later tests needs them; an idle Prefect server still costs a tenth
    of a core, which four of them made a real share of the run. Only under the grouped
    scheduler: in a plain run a group's tests are spread over the collection order.
    """
    result = yield
    group = item.stash.get(_GROUP, None)
    grouped = _GROUPS_DIR in getattr(item.config, "workerinput", {})
    if grouped and group is not None and (nextitem is None or nextitem.stash.get(_GROUP, None) != group):
        _finish_shared_fixtures(item, group)
    return result


def _finish_shared_fixtures(item: pytest.Item, group: str) -> None:
    # FixtureDef.finish runs the fixture's teardown (and, through the finalizers they registered,
    # that of every fixture built on it) and forgets its value; the session's own teardown later
    # finds it finished. Private pytest API, used only here.
    info = item._fixtureinfo  # type: ignore[attr-defined]
    for name, owner in SHARED_SESSION_FIXTURES.items():
        defs = info.name2fixturedefs.get(name) if name in item.fixturenames else None  # type: ignore[attr-defined]
        if owner == group.removesuffix(_LANE_MARK) and defs:
            defs[-1].finish(item._request)  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    if _GROUPS_KEY in config.stash:
        import shutil

        shutil.rmtree(config.stash[_GROUPS_KEY], ignore_errors=True)
