"""The production path: `prefect deploy --all` from prefect.yaml against a process work pool, and
a `prefect worker start` that runs the manual deployment (here on a folder, triage only)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, write_runbooks
from flow_driver import alert, evidence_prefix, manifest_with_gpus, report_of, wait_for, xid79_log
from testkit.services.prefect import PrefectServer

# Sized to what it starts: `prefect deploy --all`, a process worker, and a run it waits up to 420 s for.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PREFECT = str(Path(sys.executable).with_name("prefect"))


def _env(api: str, state: Path, runbooks: Path) -> dict[str, str]:
    return {**os.environ, "PREFECT_API_URL": api, "PWD": str(ROOT), "DENPEX_STATE_DIR": str(state),
            "DENPEX_RUNBOOKS_DIR": str(runbooks), "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def deployed(sqlite_prefect: PrefectServer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path]]:
    """`prefect deploy --all` and one process worker, shared by the module's tests (each names its
    own incident): deploying and starting a worker cost a minute of CPU each time.

    The SQLite server, where no deployment is served: `prefect deploy --all` creates the same
    deployment names and event triggers that the served deployments use on the other servers,
    and must not leave them behind there."""
    yield from _deployed_worker(sqlite_prefect.env(), sqlite_prefect.api_url, tmp_path_factory.mktemp("deployed"))


@pytest.fixture
def worker(deployed: tuple[dict[str, str], Path]) -> Iterator[tuple[dict[str, str], Path]]:
    """The module's deployment and worker, with this process's client pointed at its server."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    env, state = deployed
    with temporary_settings(updates={PREFECT_API_URL: env["PREFECT_API_URL"],
                                     PREFECT_API_AUTH_STRING: env["PREFECT_API_AUTH_STRING"]}):
        yield env, state


def _deployed_worker(server_env: dict[str, str], api: str,
                     tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    state, runbooks = tmp_path / "state", tmp_path / "runbooks"
    state.mkdir()
    write_runbooks(runbooks)
    # The server's own PREFECT_HOME and API, never the session harness's.
    env = {**{k: v for k, v in _env(api, state, runbooks).items() if not k.startswith("PREFECT_")},
           **server_env, "PREFECT_API_URL": api, "DENPEX_EVIDENCE_ROOT": str(tmp_path / "ingest-store")}
    created = subprocess.run([PREFECT, "work-pool", "create", "denpex", "--type", "process", "--overwrite"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert created.returncode == 0, created.stdout + created.stderr
    deployed = subprocess.run([PREFECT, "--no-prompt", "deploy", "--all"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    for name in ("denpex-triage/on-alert", "denpex-triage/manual", "denpex-replay/nightly-replay",
                 "denpex-return-to-service/return-to-service"):
        assert name in deployed.stdout, deployed.stdout[-3000:]
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([PREFECT, "worker", "start", "--pool", "denpex", "--type", "process"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield env, state
    finally:
        # Its one run has finished: nothing is lost by not waiting for its shutdown, which sat
        # 20-30 s after SIGTERM or SIGINT.
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_prefect_deploy_all_and_a_process_worker_runs_manual_triage(worker: tuple[dict[str, str], Path],
                                                                    tmp_path: Path) -> None:
    from prefect.deployments import run_deployment

    env, state = worker
    # Under the worker's DENPEX_EVIDENCE_ROOT (beside its state folder).
    evidence = state.parent / "ingest-store" / evidence_prefix("inc-deployed", cluster="no-such-cluster")
    shutil.copytree(FIXTURES / "withheld_one", evidence, ignore=shutil.ignore_patterns("*.json"))
    (evidence / "manifest.json").write_bytes(manifest_with_gpus(FIXTURES / "withheld_one"))
    (evidence / "kernel.log").write_bytes(xid79_log())
    # No target block for this cluster: the flow triages and reports, and touches nothing.
    event = alert("inc-deployed", str(evidence), cluster="no-such-cluster")
    run = run_deployment("denpex-triage/manual", parameters=event.model_dump(mode="json"), timeout=0)
    started = time.monotonic()
    assert wait_for(run.id, {"COMPLETED"}, timeout_s=420) == "COMPLETED"
    report = report_of(state, "inc-deployed", run.id)
    assert report["verdict"] == "localized" and [c["rank"] for c in report["candidates"]] == [2]
    assert report["outcome"] == "no_action" and "no-such-cluster" in report["reason"]
    # What the run says of the plan names no command-line option (it said "pass --scheduler").
    assert report["plan"]["blocked"] == ["no isolation was planned: no Slurm or Kubernetes target block is "
                                         "registered for cluster 'no-such-cluster'"]
    assert time.monotonic() - started < 420


def test_a_run_whose_job_variables_move_the_evidence_root_is_refused(worker: tuple[dict[str, str], Path],
                                                                    tmp_path: Path) -> None:
    """A process worker starts a run with ``{**its environment, **job variables["env"]}``, and the
    API sets job variables: a run pointing DENPEX_EVIDENCE_ROOT at a forged folder fails before
    reading it (attacker review: it triaged the forged folder as the incident's)."""
    from prefect import get_client
    from prefect.deployments import run_deployment

    env, state = worker
    forged_root = tmp_path / "forged"
    evidence = forged_root / evidence_prefix("inc-forged", cluster="no-such-cluster")
    shutil.copytree(FIXTURES / "withheld_one", evidence, ignore=shutil.ignore_patterns("*.json"))
    event = alert("inc-forged", str(evidence), cluster="no-such-cluster")
    run = run_deployment("denpex-triage/manual", parameters=event.model_dump(mode="json"), timeout=0,
                         job_variables={"env": {"DENPEX_EVIDENCE_ROOT": str(forged_root)}})
    with pytest.raises(AssertionError, match="ended FAILED"):
        wait_for(run.id, {"COMPLETED"}, timeout_s=420)
    with get_client(sync_client=True) as client:
        message = client.read_flow_run(run.id).state.message or ""
    assert "sets environment variable(s) DENPEX_EVIDENCE_ROOT" in message, message
    assert str(forged_root) not in message
    assert not list(state.glob("reports/**/inc-forged-*"))
    assert not list(state.glob("plans/**/inc-forged.json"))


def test_a_worker_that_can_read_the_approval_pages_secrets_runs_nothing(worker: tuple[dict[str, str], Path],
                                                                         tmp_path: Path) -> None:
    """Issue 30, A4: a worker runs the command its job configuration names, and the Prefect API
    edits that configuration; with the approvers' TOTP secrets readable by the worker's user, an
    API writer read them through such a command and approved as alice. A run that a work pool's
    worker started now refuses to go on where it can read them, before it reads any evidence."""
    from prefect import get_client
    from prefect.deployments import run_deployment

    from denpex.isolation.second_factor import TotpStore

    env, state = worker
    store = TotpStore(state)
    store.enroll("alice")
    try:
        evidence = state.parent / "ingest-store" / evidence_prefix("inc-secrets", cluster="no-such-cluster")
        shutil.copytree(FIXTURES / "withheld_one", evidence, ignore=shutil.ignore_patterns("*.json"))
        event = alert("inc-secrets", str(evidence), cluster="no-such-cluster")
        run = run_deployment("denpex-triage/manual", parameters=event.model_dump(mode="json"), timeout=0)
        with pytest.raises(AssertionError, match="ended FAILED"):
            wait_for(run.id, {"COMPLETED"}, timeout_s=420)
        with get_client(sync_client=True) as client:
            message = client.read_flow_run(run.id).state.message or ""
        assert "work pool 'denpex'" in message and "approval page's secrets" in message, message
        assert str(store.folder / "alice") in message and "denpex serve" in message
        assert not list(state.glob("reports/**/inc-secrets-*"))
    finally:
        shutil.rmtree(store.folder)
