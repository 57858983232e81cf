"""Fixtures: real moto S3, a real Prefect server with a served deployment, ``denpex serve-api``."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from denpex.ingest.plans import PlanTier
from denpex.ingest.registry import IssuedKey, IssuedToken, Registry
from testkit.services.ingest import ROOT, ApiServer
from testkit.services.prefect import PrefectServer, wait_for_deployments
from testkit.services.process_group import stop_process_group
from testkit.services.s3 import MotoS3

PROBE_DEPLOYMENT = "ingest-probe"
ALERT_TRIGGER = "denpex-alert"  # flows.serve.alert_trigger(), the probe's trigger too


@dataclass
class Engine:
    """A real Prefect server and a served deployment triggered by the alert event."""

    api_url: str
    deployment: str


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    work = tmp_path_factory.mktemp("prefect-engine")
    server = PrefectServer(work, ui=False)
    server.start()
    log = work / "serve.log"
    with log.open("ab") as out:
        served = subprocess.Popen([sys.executable, str(ROOT / "tests" / "ingest" / "probe_flow.py"), PROBE_DEPLOYMENT],
                                  stdout=out, stderr=subprocess.STDOUT, env=server.env(),
                                  cwd=ROOT, start_new_session=True)
    try:
        wait_for_deployments(server.api_url, [PROBE_DEPLOYMENT], served, log, automations=[ALERT_TRIGGER])
        yield Engine(api_url=server.api_url, deployment=PROBE_DEPLOYMENT)
    finally:
        stop_process_group(served)
        server.stop()


@pytest.fixture(scope="session")
def s3() -> Iterator[MotoS3]:
    server = MotoS3()
    server.start()
    yield server
    server.stop()


@dataclass
class Lab:
    """A running API with its state: tenants, keys and tokens."""

    api: ApiServer
    s3: MotoS3
    registry: Registry
    key: IssuedKey
    node_key: IssuedKey
    other_cluster_key: IssuedKey
    foreign_key: IssuedKey
    token: IssuedToken
    tier_keys: dict[PlanTier, IssuedKey]
    prefix: str

    @property
    def url(self) -> str:
        return self.api.url


def make_lab(tmp: Path, s3: MotoS3, engine: Engine | None, *, prefix: str, extra_args: list[str] | None = None) -> Lab:
    state = tmp / "state"
    registry = Registry(state)
    registry.add_tenant("acme", PlanTier.DATA_CENTER)
    registry.add_tenant("globex", PlanTier.DATA_CENTER)
    tier_keys = {}
    for plan in PlanTier:
        if plan is not PlanTier.DATA_CENTER:
            registry.add_tenant(f"t-{plan.value}", plan)
            # A cluster belongs to one tenant: each tier's tenant has a cluster of its own.
            tier_keys[plan] = registry.create_key(f"t-{plan.value}", f"c-{plan.value}")
    api = ApiServer(state, f"s3://{s3.bucket}/{prefix}", s3_endpoint=s3.endpoint,
                    prefect_api_url=engine.api_url if engine else None, log_dir=tmp, extra_args=extra_args)
    api.start()
    return Lab(api=api, s3=s3, registry=registry, key=registry.create_key("acme", "c1"),
               node_key=registry.create_key("acme", "c1", host="gpu-node-002"),
               other_cluster_key=registry.create_key("acme", "c2"), foreign_key=registry.create_key("globex", "g1"),
               token=registry.create_token("acme", "c1"), tier_keys=tier_keys, prefix=prefix)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, s3: MotoS3, engine: Engine) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("ingest")
    lab = make_lab(tmp, s3, engine, prefix=tmp.name, extra_args=["--max-dump-bytes", str(4 << 20)])
    yield lab
    lab.api.stop(signal.SIGTERM)
