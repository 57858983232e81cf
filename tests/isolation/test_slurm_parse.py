"""``scontrol show node`` / ``squeue`` parsers, on golden cases captured from Slurm 22.05."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from denpex.isolation.facts import ReasonOwner
from denpex.isolation.slurm_parse import (
    ControllerFault,
    controller_fault,
    expand_hostlist,
    node_not_found,
    parse_job_ids,
    parse_jobs_by_node,
    parse_show_node,
    to_node_facts,
)

CASES = sorted((Path(__file__).parent / "scontrol_cases").glob("*.json"))


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_golden_scontrol_output(case: Path) -> None:
    body = json.loads(case.read_text())
    got = [
        {"name": n.name, "state": n.state, "base_state": n.base_state, "flags": list(n.flags),
         "reason": n.reason, "reason_user": n.reason_user, "reason_time": n.reason_time,
         "partitions": list(n.partitions), "features": list(n.features),
         "isolated": n.isolated, "down": n.down, "not_responding": n.not_responding}
        for n in parse_show_node(body["output"])
    ]
    assert got == body["expected"]


def test_node_not_found_is_recognised() -> None:
    assert node_not_found("Node gpu-node-099 not found\n")
    assert not node_not_found("NodeName=gpu-node-001 State=IDLE")


@pytest.mark.parametrize(
    ("stderr", "fault"),
    [
        ("slurm_load_node error: Unable to contact slurm controller (connect failure)\n", ControllerFault.NOT_SENT),
        ("slurm_update error: Unable to contact slurm controller (receive failure)\n", ControllerFault.UNANSWERED),
        ("slurm_update error: Socket timed out on send/recv operation\n", ControllerFault.UNANSWERED),
        ("slurm_load_jobs error: Zero Bytes were transmitted or received\n", ControllerFault.UNANSWERED),
        ("scontrol: error: slurm_msg_sendto: address:port=127.0.0.1:34995 msg_type=3002: Unexpected missing "
         "socket error\nslurm_update error: Unexpected missing socket error\n", ControllerFault.UNANSWERED),
        ("slurm_update error: Invalid node state specified\n", None),
        ("Node gpu-node-099 not found\n", None),
    ],
    ids=["connect-failure", "receive-failure", "socket-timeout", "zero-bytes", "missing-socket",
         "invalid-state", "unknown-node"],
)
def test_controller_faults_are_told_from_refusals(stderr: str, fault: ControllerFault | None) -> None:
    assert controller_fault(stderr) is fault


@pytest.mark.parametrize(
    ("text", "ids"),
    [("", ()), ("12\n13\n", ("12", "13")), ("  7 \n\n7\n", ("7",)), ("1234_5\n", ("1234_5",))],
    ids=["none", "two", "blank-and-repeat", "array-task"],
)
def test_job_ids(text: str, ids: tuple[str, ...]) -> None:
    assert parse_job_ids(text) == ids


def test_facts_carry_owner_jobs_and_opt_out() -> None:
    body = json.loads((Path(__file__).parent / "scontrol_cases" / "four-nodes-oneline.json").read_text())
    nodes = {n.name: n for n in parse_show_node(body["output"])}
    mine = to_node_facts(nodes["gpu-node-002"], ["1"], "denpex_opt_out")
    assert mine.running_jobs == ("1",) and mine.owner("denpex", "inc-42") is ReasonOwner.THIS_INCIDENT
    theirs = to_node_facts(nodes["gpu-node-003"], [], "denpex_opt_out")
    assert theirs.down and theirs.owner("denpex", "inc-42") is ReasonOwner.SOMEONE_ELSE
    optout = json.loads((Path(__file__).parent / "scontrol_cases" / "down-drain-not-responding-with-features.json").read_text())
    [node] = parse_show_node(optout["output"])
    assert to_node_facts(node, [], "denpex_opt_out").opted_out


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu-node-001", ["gpu-node-001"]),
        ("gpu-node-[001-003,007],login1", ["gpu-node-001", "gpu-node-002", "gpu-node-003", "gpu-node-007", "login1"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("", []),
    ],
    ids=["single", "ranges-and-plain", "two-groups", "no-padding", "empty"],
)
def test_expand_hostlist(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


def test_expand_hostlist_refuses_garbage() -> None:
    with pytest.raises(ValueError, match="bad range"):
        expand_hostlist("n[a-b]")


def test_jobs_by_node_expands_multi_node_jobs() -> None:
    text = "12 gpu-node-[001-002]\n13 gpu-node-002\n14 (null)\n15 \n"
    assert parse_jobs_by_node(text) == {"gpu-node-001": ("12",), "gpu-node-002": ("12", "13")}
