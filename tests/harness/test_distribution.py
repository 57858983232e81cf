"""The suite's scheduler rules (tests/plugins/distribution.py): which tests share a worker, the
harness group's two lanes, and which scopes are sent first."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from plugins.distribution import LONG_FIRST, SECOND_LANE, group_of, long_scopes_first

ROOT = Path(__file__).resolve().parents[2]


def _item(nodeid: str, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures))


def test_the_harness_groups_second_lane_is_its_listed_modules() -> None:
    lane_two = "tests/flows/test_triage_flow.py::test_x"
    lane_one = "tests/flows/test_audit_across_incidents.py::test_y"
    assert group_of(_item(lane_two, "flow_rig", "prefect_harness", "slurm_lab")) == "prefect-harness#2"
    assert group_of(_item(lane_one, "flow_rig", "prefect_harness", "slurm_lab")) == "prefect-harness"
    # Another group's tests in a listed module keep their own group.
    assert group_of(_item("tests/flows/test_triage_flow.py::test_z", "slurm_lab")) == "slurm-lab"


def test_every_module_named_for_a_second_lane_exists() -> None:
    # A renamed module would silently fall back to the first lane and lengthen it again.
    for modules in SECOND_LANE.values():
        for module in modules:
            assert (ROOT / module).is_file(), module


def test_long_scopes_are_sent_first_in_the_listed_order() -> None:
    scopes = {"tests/a.py::test_short", "slurm-lab", "prefect-harness", "prefect-harness#2",
              "tests/flows/test_demo_signals.py::test_b", "tests/flows/test_demo.py::test_a", "gloo-cases"}
    assert long_scopes_first(scopes) == [
        "prefect-harness#2", "prefect-harness", "slurm-lab",
        "tests/flows/test_demo.py::test_a", "tests/flows/test_demo_signals.py::test_b", "gloo-cases"]
    assert long_scopes_first({"tests/a.py::test_short"}) == []
    assert len(set(LONG_FIRST)) == len(LONG_FIRST)


class _Config:
    """What the scheduler reads of pytest's config on the controller."""

    def __init__(self, groups_dir: Path, workers: int) -> None:
        from plugins.distribution import _GROUPS_KEY

        self.stash = {_GROUPS_KEY: groups_dir}
        self.option = SimpleNamespace(loadscopereorder=True)
        self._tx = [f"{workers}*popen"]
        self.reports: list[object] = []
        self.hook = SimpleNamespace(pytest_collectreport=lambda report: self.reports.append(report))

    def getvalue(self, name: str) -> object:
        return self._tx if name == "tx" else None


class _Node:
    """A worker as the scheduler drives it: it records the tests it is sent."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


def _scheduler(tmp_path: Path, groups: dict[str, str], collections: list[list[str]]) -> tuple[object, list[_Node]]:
    import json

    from plugins.distribution import pytest_xdist_make_scheduler

    (tmp_path / "gw0.json").write_text(json.dumps(groups))
    scheduler = pytest_xdist_make_scheduler(_Config(tmp_path, len(collections)), None)
    nodes = [_Node(f"gw{i}") for i in range(len(collections))]
    for node, collection in zip(nodes, collections, strict=True):
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    return scheduler, nodes


def test_the_scheduler_sends_the_long_groups_first_each_to_a_worker_of_its_own(tmp_path: Path) -> None:
    shorts = [f"tests/a.py::test_{i}" for i in range(40)]  # more tests than any group, listed first
    lane_one = ["tests/flows/test_audit.py::test_a", "tests/flows/test_audit.py::test_b"]
    lane_two = ["tests/flows/test_triage_flow.py::test_c"]
    collection = shorts + lane_one + lane_two
    groups = {**dict.fromkeys(lane_one, "prefect-harness"), **dict.fromkeys(lane_two, "prefect-harness#2")}
    scheduler, (first, second) = _scheduler(tmp_path, groups, [collection, collection])
    # Each worker's first work unit is a lane, the second lane's first; the short tests follow.
    assert [collection[i] for i in first.sent[:1]] == lane_two
    assert [collection[i] for i in second.sent[:2]] == lane_one
    assert not scheduler.tests_finished


def test_when_the_workers_collected_different_tests_the_run_stops_instead_of_waiting(tmp_path: Path) -> None:
    groups = {"tests/flows/test_audit.py::test_a": "prefect-harness"}
    scheduler, nodes = _scheduler(tmp_path, groups, [["tests/flows/test_audit.py::test_a", "tests/a.py::test_1"],
                                                     ["tests/a.py::test_1"]])
    # xdist reports the difference and sends nothing; no placeholder of ours is left queued.
    assert [node.sent for node in nodes] == [[], []]
    assert not scheduler.workqueue
