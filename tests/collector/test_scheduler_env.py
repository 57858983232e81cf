"""The registration and the alert meet on the scheduler's job id and node name (issue 18)."""

from __future__ import annotations

import socket

import pytest

from denpex.collector import UploadTarget
from denpex.collector.scheduler_env import node_name, scheduler_job_id
from denpex.collector.uploader import registration_body

_BASE = {"DENPEX_INGEST_URL": "http://127.0.0.1:1", "DENPEX_INGEST_KEY_ID": "dk_1", "DENPEX_INGEST_SECRET": "s",
         "DENPEX_TENANT": "acme", "DENPEX_CLUSTER": "c1"}


@pytest.mark.parametrize("env, expected", [
    ({"SLURMD_NODENAME": "gpu-node-002", "NODE_NAME": "k8s-node"}, "gpu-node-002"),
    ({"NODE_NAME": "k8s-node-7"}, "k8s-node-7"),
    ({"KUBERNETES_NODE_NAME": "k8s-node-8"}, "k8s-node-8"),
    ({"DENPEX_NODE_NAME": "override", "SLURMD_NODENAME": "gpu-node-002"}, "override"),
    ({"SLURMD_NODENAME": "  "}, socket.gethostname()),
])
def test_the_host_is_the_schedulers_node_name_else_the_hostname(env: dict[str, str], expected: str) -> None:
    assert node_name(env) == expected


def test_the_job_id_is_the_schedulers_unless_one_is_given() -> None:
    assert scheduler_job_id({"SLURM_JOB_ID": "4242"}) == "4242"
    assert scheduler_job_id({"SLURM_JOB_ID": "4242", "DENPEX_JOB_ID": "mine"}) == "mine"
    assert scheduler_job_id({"KUBERNETES_JOB_NAME": "train-7"}) == "train-7"
    assert scheduler_job_id({}) is None
    target = UploadTarget.from_env({**_BASE, "SLURM_JOB_ID": "4242"})
    assert target is not None and target.job_id == "4242"
    with pytest.raises(ValueError, match="DENPEX_JOB_ID"):
        UploadTarget.from_env(_BASE)


def test_a_registration_carries_the_placement_and_nothing_else() -> None:
    identity = {"job_id": "j", "incident_id": "", "rank": 3, "world_size": 4, "host": "gpu-node-004",
                "local_rank": 1, "pid": 77, "gpu_uuid": None, "gpu_pci_bus_id": "0000:3b:00.0",
                "dumped_at": "2026-12-01T13:09:14+00:00", "process_groups": {"0": {"desc": "default_pg",
                                                                                 "ranks": [0, 1, 2, 3]}}}
    assert registration_body(identity) == {
        "world_size": 4, "ranks": {"3": {"host": "gpu-node-004", "local_rank": 1, "pid": 77,
                                         "gpu_pci_bus_id": "0000:3b:00.0"}},
        "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}}
    assert registration_body({"world_size": 4}) is None  # no rank: nothing to register
