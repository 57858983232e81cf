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
