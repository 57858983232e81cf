"""Rank -> node from a Kubernetes job's pods (issue 18, item 2, on Kubernetes): which labels give a
pod's node rank, the block layout, and when a derivation is refused. The pods are read through the
real ``kubernetes`` client from the loopback API server fake; the flow end to end is in
tests/flows/test_k8s_dead_rank_flow.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr

from denpex.isolation.config import KubernetesSettings
from denpex.isolation.k8s_layout import COMPLETION_INDEX, KUBEFLOW_INDEX, KUBEFLOW_TYPE, JobPod, derive_pod_hosts
from denpex.isolation.kubernetes import KubernetesAdapter
from denpex.isolation.ssh import Backoff
from testkit.fakes.k8s_api import FakeApiServer, make_node, make_pod

INCIDENT = datetime(2026, 12, 1, 13, 9, 0, tzinfo=UTC)


def pod(index: int, node: str, *, namespace: str = "train", phase: str = "Running",
        created: datetime | None = INCIDENT - timedelta(hours=1), labels: dict[str, str] | None = None) -> JobPod:
    return JobPod(name=f"job-7-{index}", namespace=namespace, node=node, phase=phase, created=created,
                  labels=labels if labels is not None else {COMPLETION_INDEX: str(index)})


def test_an_indexed_job_places_each_pods_block_of_ranks_on_its_node() -> None:
    pods = [pod(1, "gpu-node-007"), pod(0, "gpu-node-003")]
    assert derive_pod_hosts(pods, 2, "job-7", INCIDENT) == ({0: "gpu-node-003", 1: "gpu-node-007"}, None)
    hosts, why = derive_pod_hosts(pods, 16, "job-7", INCIDENT)  # torchrun, 8 per pod
    assert why is None and [hosts[r] for r in (0, 7, 8, 15)] == ["gpu-node-003"] * 2 + ["gpu-node-007"] * 2


def test_a_pytorchjob_master_is_node_rank_zero_and_workers_follow() -> None:
    pods = [pod(0, "gpu-node-005", labels={KUBEFLOW_TYPE: "Worker", KUBEFLOW_INDEX: "0"}),
            pod(0, "gpu-node-001", labels={KUBEFLOW_TYPE: "Master", KUBEFLOW_INDEX: "0"}),
            pod(1, "gpu-node-009", labels={KUBEFLOW_TYPE: "Worker", KUBEFLOW_INDEX: "1"})]
    assert derive_pod_hosts(pods, 3, "job-7", INCIDENT) == (
        {0: "gpu-node-001", 1: "gpu-node-005", 2: "gpu-node-009"}, None)


def test_the_dead_ranks_failed_pod_still_says_where_it_ran_and_a_pod_made_after_the_incident_does_not() -> None:
    # Index 1's pod failed with the killed rank; the Job made a new one, after the incident, elsewhere.
    pods = [pod(0, "gpu-node-003"), pod(1, "gpu-node-004", phase="Failed"),
            pod(1, "gpu-node-011", created=INCIDENT + timedelta(minutes=2))]
    assert derive_pod_hosts(pods, 2, "job-7", INCIDENT) == ({0: "gpu-node-003", 1: "gpu-node-004"}, None)
    # Without the incident's time, the running pod (made after it) is taken: the time is what tells.
    assert derive_pod_hosts(pods, 2, "job-7", None)[0][1] == "gpu-node-011"


@pytest.mark.parametrize(("pods", "world", "needle"), [
    pytest.param([pod(0, "gpu-node-003"), pod(1, "gpu-node-004", namespace="other-tenant")], 2,
                 "more than one namespace", id="two-namespaces"),
    pytest.param([pod(0, "gpu-node-003"), pod(1, "gpu-node-004", labels={"app": "x"})], 2,
                 "no completion or replica index", id="no-index-label"),
    pytest.param([pod(0, "gpu-node-003"), pod(2, "gpu-node-004")], 2, "not 0..1", id="gap-in-indexes"),
    pytest.param([pod(0, "gpu-node-003"), pod(1, "gpu-node-004")], 3, "do not split evenly", id="uneven"),
    pytest.param([pod(0, "gpu-node-003", created=INCIDENT + timedelta(seconds=1))], 1,
                 "no pod placed on a node before the incident", id="all-after"),
    pytest.param([pod(0, "gpu-node-003"), pod(1, "gpu-node-004"), pod(1, "gpu-node-005")], 2,
                 "node rank 1 has pods on gpu-node-004, gpu-node-005", id="two-live-pods-same-time"),
])
def test_what_is_not_guessed(pods: list[JobPod], world: int, needle: str) -> None:
    hosts, why = derive_pod_hosts(pods, world, "job-7", INCIDENT)
    assert hosts == {} and why is not None and needle in why


def test_a_later_or_unplaced_pod_of_another_namespace_does_not_block_and_a_naive_time_is_utc() -> None:
    """Hostile review, finding 9: another namespace's pending pod made after the incident, with
    the same job label, turned a valid derivation into a refusal; a naive time raised TypeError."""
    pods = [pod(0, "gpu-node-003"), pod(1, "gpu-node-004"),
            pod(0, "gpu-node-009", namespace="other", created=INCIDENT + timedelta(minutes=5))]
    assert derive_pod_hosts(pods, 2, "job-7", INCIDENT) == ({0: "gpu-node-003", 1: "gpu-node-004"}, None)
    assert derive_pod_hosts(pods, 2, "job-7", INCIDENT.replace(tzinfo=None))[1] is None


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for i in range(1, 5):
            server.add_node(make_node(f"gpu-node-{i:03d}"))
        made = (INCIDENT - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
        server.pods += [
            make_pod("train", f"job-7-{i}-abc", f"gpu-node-00{i + 1}", created=made, owner="Job",
                     phase="Failed" if i == 1 else "Running",
                     labels={"batch.kubernetes.io/job-name": "job-7", "job-name": "job-7", COMPLETION_INDEX: str(i)})
            for i in range(4)]
        server.pods.append(make_pod("train", "other-job-0", "gpu-node-001", labels={"job-name": "job-8"}))
        yield server


def test_the_adapter_lists_the_jobs_pods_once_each_through_the_real_client(api: FakeApiServer) -> None:
    settings = KubernetesSettings(host=api.url, token=SecretStr("test-token"), request_timeout_s=5,
                                  backoff=Backoff(attempts=2, initial_s=0.02, max_s=0.05))
    with KubernetesAdapter.connect(settings, opt_out_label="denpex.io/opt-out") as adapter:
        pods = adapter.job_pods("job-7")
    assert sorted(p.name for p in pods) == [f"job-7-{i}-abc" for i in range(4)]  # two labels, one entry
    assert {p.name: p.phase for p in pods}["job-7-1-abc"] == "Failed"
    assert all(p.created == INCIDENT - timedelta(hours=1) for p in pods)
    assert derive_pod_hosts(pods, 4, "job-7", INCIDENT) == (
        {0: "gpu-node-001", 1: "gpu-node-002", 2: "gpu-node-003", 3: "gpu-node-004"}, None)
    selectors = [path for method, path, *_ in api.requests if method == "GET" and "labelSelector" in path]
    assert selectors and all("job-7" in s for s in selectors)
