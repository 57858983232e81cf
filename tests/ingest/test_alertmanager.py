"""A real Prometheus Alertmanager delivers an NCCL-timeout alert, and repeats it: exactly one run.

Alertmanager is Debian's ``prometheus-alertmanager`` (scripts/install_system_deps.sh); when it is
missing this test fails, it never skips.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from denpex.ingest.client import IngestClient
from ingest.conftest import Engine, Lab
from ingest.test_api import _runs_for
from testkit.services.net import free_port, wait_http
from testkit.services.process_group import stop_process_group

# Sized to what it starts: a real Alertmanager, the API and a Prefect server.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CONFIG = """\
route:
  receiver: denpex
  group_by: ['tenant', 'cluster', 'job_id']
  group_wait: 1s
  group_interval: 2s
  repeat_interval: 4s
receivers:
- name: denpex
  webhook_configs:
  - url: {url}/v1/alerts
    send_resolved: true
    http_config:
      authorization:
        credentials: {token}
"""


def test_alertmanager_repeats_start_exactly_one_run(lab: Lab, engine: Engine, tmp_path: Path) -> None:
    program = shutil.which("prometheus-alertmanager")
    assert program, "prometheus-alertmanager is not installed: run scripts/install_system_deps.sh"
    (tmp_path / "am.yml").write_text(CONFIG.format(url=lab.url, token=lab.token.token))
    port = free_port()
    log = tmp_path / "alertmanager.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([program, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 60, proc, log)
        job = f"am-job-{port}"
        labels = {"alertname": "NCCLWatchdogTimeout", "tenant": "acme", "cluster": "c1", "job_id": job, "rank": "3",
                  "world_size": "4"}
        # Fired the way a Prometheus or Loki ruler does: through Alertmanager's own API.
        fired = httpx.post(f"http://127.0.0.1:{port}/api/v2/alerts", timeout=10,
                           json=[{"labels": labels, "annotations": {"summary": "Watchdog caught collective operation timeout"}}])
        assert fired.status_code == 200, fired.text
        me = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
        incident, view = _wait_deliveries(me, lab, job, at_least=2)
        assert view["alert_deliveries"] >= 2, view  # a repeat notification arrived
        runs = _runs_for(engine, view["alert_id"])
        assert len(runs) == 1, runs
        assert runs[0]["parameters"]["job_id"] == job and runs[0]["parameters"]["reported_by_rank"] == 3
        assert runs[0]["parameters"]["incident_id"] == incident
    finally:
        stop_process_group(proc)


def _wait_deliveries(client: IngestClient, lab: Lab, job: str, *, at_least: int) -> tuple[str, dict]:
    """Find the incident Alertmanager's deliveries opened for ``job`` and wait for repeats."""
    from denpex.ingest.incidents import IncidentBook

    book = IncidentBook(lab.registry.db)
    deadline = time.monotonic() + 60
    view: dict = {}
    while time.monotonic() < deadline:
        incident = book.open_incident("acme", "c1", job)
        if incident is not None:
            view = client.incident(incident).json()
            if view.get("alert_deliveries", 0) >= at_least:
                return incident, view
        time.sleep(0.5)
    raise AssertionError(f"Alertmanager delivered fewer than {at_least} notifications in 60 s: {view}")
