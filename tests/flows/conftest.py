"""The real Prefect engine for the flow tests: the session's test harness server
(``prefect_harness``, tests/plugins/services.py), a `serve()` process running the deployments
against it, moto S3 in HTTP server mode, and the session's real Slurm lab.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
import yaml
from moto.server import ThreadedMotoServer

from denpex.ingest.client import IngestClient
from denpex.ingest.plans import PlanTier
from denpex.ingest.registry import IssuedKey, Registry
from denpex.isolation.operator import BREAKER_NAME
from flow_driver import FlowRig, enroll_approvers, use_page
from testkit.services.approval_page import approval_page
from testkit.services.ingest import ApiServer
from testkit.services.prefect import wait_for_deployments
from testkit.services.process_group import stop_process_group
from testkit.services.slurm import SlurmLab

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "gloo"
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
INGEST_STORE = "s3://evidence/ingest"
"""The --store of the ingest services the flow tests start (the rig's flows triage only in it,
in ``s3://evidence`` where ``upload`` puts incidents, and in ``local_store``)."""


def local_store(rig: FlowRig) -> Path:
    """The rig's folder store: incidents laid out as the ingest service lays them out on disk."""
    return rig.state_dir.parent / "ingest-store"


def write_runbooks(folder: Path) -> None:
    """The shipped hang-triage runbook with test timings and named approvers (the shipped one lists
    nobody, so no Prefect UI approval passes until an operator names people), and a variant that
    times out fast. The shipped second factor stays: each approval carries a TOTP code
    (``flow_driver.enroll_approvers`` and ``resume(..., state_dir=)``).

    The bundled dumps were recorded on 2026-11-29, so the plan's evidence is older than the
    shipped six-hour ``max_plan_age``: the test runbook allows replaying a recorded incident.
    """
    body = yaml.safe_load((ROOT / "runbooks" / "hang-triage.yaml").read_text())
    body["approval"]["max_plan_age"] = "P3650D"
    body["approval"]["approvers"] = ["alice", "bob", "carol"]
    body["workflow"] = {"evidence_grace": "PT6S", "coverage_poll": "PT1S", "approval_timeout": "PT240S",
                        "approval_poll": "PT1S", "remediation_retries": 2}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hang-triage.yaml").write_text(yaml.safe_dump(body))
    quick = dict(body, name="hang-triage-quick", workflow=dict(body["workflow"], approval_timeout="PT12S"))
    (folder / "hang-triage-quick.yaml").write_text(yaml.safe_dump(quick))
    # A single trusted operator's runbook: the Prefect form, no second factor (README).
    form = dict(body, name="hang-triage-form", approval=dict(body["approval"], second_factor="none",
                                                             channels=["cli-signed", "prefect-ui"]))
    (folder / "hang-triage-form.yaml").write_text(yaml.safe_dump(form))
    # The same runbook under a name the rig's workers do not allow (DENPEX_PREFECT_FORM_RUNBOOKS).
    (folder / "hang-triage-form-unlisted.yaml").write_text(yaml.safe_dump(dict(form, name="hang-triage-form-unlisted")))


@pytest.fixture(scope="session")
def prefect_api(prefect_harness: str) -> str:
    return prefect_harness


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    # The session's boto3 clients (upload() below, the flows' own) find moto's test credentials in
    # the environment, until the session ends.
    credentials = pytest.MonkeyPatch()
    for key, value in AWS_ENV.items():
        credentials.setenv(key, value)
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="evidence")
    yield endpoint
    server.stop()
    credentials.undo()


def upload(endpoint: str, prefix: str, folder: Path, *, ranks: set[int] | None = None,
           extra: dict[str, bytes] | None = None) -> str:
    """Put a fixture folder's pickles and manifest under ``s3://evidence/<prefix>``."""
    client = boto3.client("s3", endpoint_url=endpoint)
    for path in sorted(folder.iterdir()):
        if path.suffix == ".pkl" and (ranks is None or int(path.stem.rsplit("_", 1)[1]) in ranks):
            client.put_object(Bucket="evidence", Key=f"{prefix}/{path.name}", Body=path.read_bytes())
        elif path.name == "manifest.json":
            client.put_object(Bucket="evidence", Key=f"{prefix}/{path.name}", Body=path.read_bytes())
    for name, body in (extra or {}).items():
        client.put_object(Bucket="evidence", Key=f"{prefix}/{name}", Body=body)
    return f"s3://evidence/{prefix}"


def register_blocks(slurm: SlurmLab, runbook: str = "hang-triage") -> None:
    from blocks import DenpexRunbook, DenpexSlurmTarget, DenpexSshCredentials

    DenpexRunbook(name=runbook).save("default", overwrite=True)
    creds = DenpexSshCredentials(username="root", private_key=slurm.client_key.read_text(),
                                 known_hosts=slurm.known_hosts.read_text())
    DenpexSlurmTarget(cluster_name="lab", host="127.0.0.1", port=slurm.ssh_port, credentials=creds,
                      connect_timeout_s=5, command_timeout_s=20).save("lab", overwrite=True)


@pytest.fixture(scope="session")
def flow_rig(prefect_api: str, s3_endpoint: str, slurm_lab: SlurmLab,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowRig]:
    work = tmp_path_factory.mktemp("flow-rig")
    state = work / "state"
    runbooks = work / "runbooks"
    state.mkdir()
    write_runbooks(runbooks)
    enroll_approvers(state)
    register_blocks(slurm_lab)
    with approval_page(state, prefect_api, log=work / "page.log") as page:
        use_page(state, page.url)
        env = {**os.environ, **AWS_ENV, "PREFECT_API_URL": prefect_api, "DENPEX_STATE_DIR": str(state),
               "DENPEX_RUNBOOKS_DIR": str(runbooks), "DENPEX_S3_ENDPOINT_URL": s3_endpoint,
               "DENPEX_EVIDENCE_ROOT": f"s3://evidence {INGEST_STORE} {work / 'ingest-store'}",
               "DENPEX_APPROVAL_PAGE_URL": page.url, "DENPEX_PREFECT_FORM_RUNBOOKS": "hang-triage-form",
               "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        log = work / "serve.log"
        with log.open("wb") as out:
            served = subprocess.Popen([sys.executable, "-m", "flows.serve"], cwd=ROOT, env=env,
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for_deployments(prefect_api, ["on-alert", "manual", "return-to-service", "requeue-hung-job"], served,
                                 log, automations=["denpex-alert"])
            yield FlowRig(prefect_api, state, runbooks, s3_endpoint, slurm_lab, served, log, page.url)
        finally:
            stop_process_group(served)  # serve with the runs it forked (paused ones would wait on)



@dataclass
class RigIngest:
    """The flow rig's real ingest service (``denpex serve-api``) and its state: it stores into the
    rig's S3 (``INGEST_STORE``) and starts the rig's served flow through the session's API."""

    api: ApiServer
    registry: Registry
    prefix: str
    """``INGEST_STORE`` without ``s3://evidence/``: where the service lays incidents out."""

    @property
    def url(self) -> str:
        return self.api.url

    def key(self, host: str | None = None) -> IssuedKey:
        """A fresh key of tenant acme's cluster lab (a node agent's when ``host`` is given)."""
        return self.registry.create_key("acme", "lab", host=host)

    def client(self, key: IssuedKey) -> IngestClient:
        return IngestClient(self.api.url, key_id=key.key_id, secret=key.secret, tenant="acme", cluster="lab")


@pytest.fixture(scope="session")
def rig_ingest(flow_rig: FlowRig, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RigIngest]:
    """One ingest service for every flow test that goes through it: each names its own jobs and
    incidents, so one service serves them all (a start costs seconds of CPU each time)."""
    work = tmp_path_factory.mktemp("rig-ingest")
    registry = Registry(work / "state")
    registry.add_tenant("acme", PlanTier.DATA_CENTER)
    api = ApiServer(work / "state", INGEST_STORE, s3_endpoint=flow_rig.s3_endpoint,
                    prefect_api_url=flow_rig.api_url, log_dir=work)
    api.start()
    try:
        yield RigIngest(api, registry, INGEST_STORE.removeprefix("s3://evidence/"))
    finally:
        api.stop(signal.SIGTERM)


@pytest.fixture(autouse=True)
def _fresh_rate_limit(request: pytest.FixtureRequest) -> None:
    """Each flow test on the rig starts with no isolation in the last hour, as ``lab`` starts it
    with no drained node. The breaker remembers every drain the earlier tests of the session sent
    to cluster ``lab``, and from the fifth on the per-cluster hourly limit (4) blocked the next
    approved drain: the outcome then depended on which tests ran before on the same worker."""
    if "flow_rig" in request.fixturenames:
        rig: FlowRig = request.getfixturevalue("flow_rig")
        (rig.state_dir / BREAKER_NAME).unlink(missing_ok=True)
