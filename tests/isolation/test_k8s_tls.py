"""Kubernetes over TLS: kubeconfig contexts, a pinned CA, and an untrusted server refused.

The fake API server serves HTTPS with a throwaway CA, so the real client does the real
handshake and certificate check that a production API server would demand.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from denpex.isolation.audit import Outcome, verify_audit_log
from denpex.isolation.config import KubernetesSettings
from denpex.isolation.errors import ApprovalError, HostKeyError
from denpex.isolation.run.report import RunMode
from denpex.isolation.kubernetes import KubernetesAdapter
from denpex.isolation.plan import Operation
from denpex.isolation.ssh import Backoff
from isolation.test_k8s_adapter import NODE, K8sRun, execute, make_plan
from isolation.trust import signed
from testkit.fakes.k8s_api import FakeApiServer, make_node
from testkit.fakes.tls_certs import LoopbackPki, make_pki

FAST = Backoff(attempts=3, initial_s=0.01, max_s=0.02)
OPT_OUT = "denpex.io/opt-out"


@pytest.fixture(scope="module")
def trusted(tmp_path_factory: pytest.TempPathFactory) -> LoopbackPki:
    return make_pki(tmp_path_factory.mktemp("pki-trusted"), "cluster")


@pytest.fixture(scope="module")
def impostor(tmp_path_factory: pytest.TempPathFactory) -> LoopbackPki:
    return make_pki(tmp_path_factory.mktemp("pki-impostor"), "impostor")


def serve(pki: LoopbackPki) -> FakeApiServer:
    server = FakeApiServer(tls=pki.server_context())
    for i in range(1, 17):  # enough nodes that one drain stays inside the blast-radius limit
        server.add_node(make_node(f"gpu-node-{i:03d}", labels={"denpex.io/partition": "a100"}))
    return server


@pytest.fixture
def api(trusted: LoopbackPki) -> Iterator[FakeApiServer]:
    with serve(trusted) as server:
        yield server


def write_kubeconfig(path: Path, api_url: str, ca: LoopbackPki) -> Path:
    """Two contexts: the current one points at a closed port, so only ``--context`` reaches the API."""
    ca_data = base64.b64encode(ca.ca_cert.read_bytes()).decode()
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "staging",
        "clusters": [
            {"name": "gpu-prod", "cluster": {"server": api_url, "certificate-authority-data": ca_data}},
            {"name": "staging", "cluster": {"server": "https://127.0.0.1:9", "certificate-authority-data": ca_data}},
        ],
        "users": [{"name": "denpex", "user": {"token": "test-token"}}],
        "contexts": [
            {"name": "gpu-prod", "context": {"cluster": "gpu-prod", "user": "denpex"}},
            {"name": "staging", "context": {"cluster": "staging", "user": "denpex"}},
        ],
    }))
    return path


def test_kubeconfig_context_over_tls_cordons_verifies_and_audits(api: FakeApiServer, trusted: LoopbackPki,
                                                                 tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, trusted)
    settings = KubernetesSettings(kubeconfig=kubeconfig, context="gpu-prod", backoff=FAST)
    with KubernetesAdapter.connect(settings, opt_out_label=OPT_OUT) as adapter:
        assert api.url.startswith("https://")
        executor = K8sRun(adapter, tmp_path)
        report = execute(executor, make_plan(adapter))
    assert report.nodes[0].outcome is Outcome.APPLIED
    assert api.nodes[NODE]["spec"]["unschedulable"] is True
    assert verify_audit_log(tmp_path / "audit.jsonl").ok


def test_an_approval_for_another_context_is_refused(api: FakeApiServer, trusted: LoopbackPki,
                                                   tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url, trusted)
    settings = KubernetesSettings(kubeconfig=kubeconfig, context="gpu-prod", backoff=FAST)
    with KubernetesAdapter.connect(settings, opt_out_label=OPT_OUT) as adapter:
        assert adapter.cluster_name() == "gpu-prod"
        executor = K8sRun(adapter, tmp_path)
        plan = make_plan(adapter, cluster="staging")
        # A plan made (and approved) for staging never acts on the context the settings reach.
        with pytest.raises(ApprovalError, match="made for cluster 'staging', but the settings reach 'gpu-prod'"):
            executor.run(plan, mode=RunMode.EXECUTE)
        assert "unschedulable" not in api.nodes[NODE]["spec"]
        offline = make_plan(adapter).model_copy(update={"cluster": None})
        with pytest.raises(ApprovalError, match="for cluster 'staging', but the settings reach cluster 'gpu-prod'"):
            executor.run(offline, mode=RunMode.EXECUTE, approval=signed(offline, cluster="staging"))
        assert "unschedulable" not in api.nodes[NODE]["spec"]
        prod = signed(offline, cluster="gpu-prod")
        assert executor.run(offline, mode=RunMode.EXECUTE, approval=prod).nodes[0].outcome is Outcome.APPLIED


def test_host_token_and_pinned_ca_reach_the_api(api: FakeApiServer, trusted: LoopbackPki) -> None:
    settings = KubernetesSettings(host=api.url, token="test-token", ca_cert=trusted.ca_cert, backoff=FAST)
    with KubernetesAdapter.connect(settings, opt_out_label=OPT_OUT) as adapter:
        assert adapter.node_facts(NODE).exists


@pytest.mark.parametrize("how", ["kubeconfig", "host_and_ca"])
def test_untrusted_server_certificate_is_refused_before_anything_is_sent(
        how: str, trusted: LoopbackPki, impostor: LoopbackPki, tmp_path: Path) -> None:
    with serve(impostor) as api:
        if how == "kubeconfig":
            settings = KubernetesSettings(kubeconfig=write_kubeconfig(tmp_path / "kc", api.url, trusted),
                                          context="gpu-prod", backoff=FAST)
        else:
            settings = KubernetesSettings(host=api.url, token="test-token", ca_cert=trusted.ca_cert, backoff=FAST)
        with KubernetesAdapter.connect(settings, opt_out_label=OPT_OUT) as adapter:
            with pytest.raises(HostKeyError, match="certificate is not trusted"):
                adapter.cluster_facts()
            with pytest.raises(HostKeyError):  # a change is refused the same way, not retried blind
                adapter.apply(make_plan(None).actions[0], Operation.ISOLATE)
    assert api.requests == []  # no request (and no token) ever reached the impostor's handler
    assert "unschedulable" not in api.nodes[NODE]["spec"]

