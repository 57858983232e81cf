"""Served flow runs are forked from a forkserver that already imported Prefect and the flows
(flows/forked_runs.py): a probe flow served the way flows/serve.py serves the real ones, on the
real engine against the session's Prefect API, run through its deployment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.services.prefect import wait_for_deployments

# Sized to what it starts: a Prefect server and a served deployment.
pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def test_a_served_run_is_forked_from_the_preloaded_server(prefect_api: str, tmp_path: Path) -> None:
    from prefect.deployments import run_deployment

    seen_file, log = tmp_path / "seen.json", tmp_path / "serve.log"
    env = dict(os.environ, PREFECT_API_URL=prefect_api, PREFECT_RUNNER_POLL_FREQUENCY="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    served = subprocess.Popen([sys.executable, str(HERE / "forked_probe.py")], cwd=ROOT, env=env,
                              stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_for_deployments(prefect_api, ["probe"], served, log, 180)
        run = run_deployment("forked-probe/probe", parameters={"out": str(seen_file)}, timeout=300)
        assert run.state is not None and run.state.is_completed(), (run.state, log.read_text()[-3000:])
    finally:
        served.terminate()
        served.wait(timeout=60)
    seen = json.loads(seen_file.read_text())
    assert seen["preloaded"], "the run did not start from the preloaded forkserver"
    # What each run used to load for itself (flows/run_preload.py): Prefect's collections, boto3.
    assert seen["collections_loaded"] and seen["boto3"], seen
    # The forkserver's child, not the runner's, and not `python -m prefect.engine` loading the code
    # from storage (which would also have named a main module).
    assert seen["parent"] != served.pid
    # The runner's main module (the probe script) is not imported again in the run, nor then in
    # each parse worker the run starts.
    assert seen["main"] is None
    assert "Downloading flow code from storage" not in log.read_text()
