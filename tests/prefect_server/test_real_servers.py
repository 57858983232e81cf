"""`prefect server start` as in production, on SQLite and on a real PostgreSQL (the session's
servers, tests/plugins/services.py).

A real flow (the replay) runs in its own process against each server; the run's final state and
its artifact are read back through the REST API, and on PostgreSQL the rows are in its tables.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from plugins.services import PostgresPrefect
from testkit.services.postgres import PG_BIN, psql
from testkit.services.prefect import PrefectServer

# Sized to what it starts: `prefect server start` on SQLite (behind basic authentication) and on PostgreSQL.
pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "incidents" / "catalog.json"


def one_incident_catalog(tmp_path: Path) -> Path:
    raw = json.loads(CATALOG.read_text())
    [entry] = [i for i in raw["incidents"] if i["incident_id"] == "gloo-withheld-one"]
    entry["evidence"] = str((CATALOG.parent / entry["evidence"]).resolve())
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"version": 1, "incidents": [entry]}))
    return path


def run_replay(server: PrefectServer, catalog: Path) -> dict[str, object]:
    """Run the replay flow in a fresh process against ``server``; return its flow run."""
    code = ("import sys; from flows.replay import replay; "
            "state = replay(catalog=sys.argv[1], return_state=True); "
            "print('FLOW_RUN', state.state_details.flow_run_id); "
            "print(state.message); state.is_failed() and state.result(raise_on_failure=False)")
    # A catalog other than the bundled one must lie under the run's state directory.
    env = {**server.env(), "DENPEX_STATE_DIR": str(catalog.parent)}
    done = subprocess.run([sys.executable, "-c", code, str(catalog)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [flow_run_id] = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("FLOW_RUN")]
    response = httpx.get(f"{server.api_url}/flow_runs/{flow_run_id}", timeout=10, headers=server.headers)
    response.raise_for_status()
    run: dict[str, object] = response.json()
    # On a failed run, what the flow said is the first thing a reader needs.
    assert run["state_type"] == "COMPLETED", done.stdout[-3000:] + done.stderr[-3000:]
    return run


def drift_artifact(server: PrefectServer, flow_run_id: str) -> str:
    response = httpx.post(f"{server.api_url}/artifacts/filter", timeout=10, headers=server.headers, json={
        "artifacts": {"key": {"any_": ["replay-drift"]}, "flow_run_id": {"any_": [flow_run_id]}}})
    response.raise_for_status()
    [artifact] = response.json()
    return str(artifact["data"])


def test_flow_runs_against_prefect_server_on_sqlite(sqlite_prefect: PrefectServer, tmp_path: Path) -> None:
    server = sqlite_prefect
    ui = httpx.get(f"{server.url}/ui-settings", timeout=10).json()
    assert ui["api_url"] == server.api_url, "the UI must be told the server's real port"
    run = run_replay(server, one_incident_catalog(tmp_path))
    assert run["state_type"] == "COMPLETED"
    assert "All 1 incidents replay as recorded" in drift_artifact(server, str(run["id"]))
    assert (server.home / "prefect.db").exists()


def test_flow_runs_against_prefect_server_on_postgresql(postgres_prefect: PostgresPrefect, tmp_path: Path) -> None:
    assert (PG_BIN / "postgres").exists(), f"PostgreSQL 15 is missing ({PG_BIN}): scripts/install_system_deps.sh"
    server, url = postgres_prefect.server, postgres_prefect.database_url
    run = run_replay(server, one_incident_catalog(tmp_path))
    assert run["state_type"] == "COMPLETED"
    assert "All 1 incidents replay as recorded" in drift_artifact(server, str(run["id"]))
    stored = psql(url, f"select count(*) from flow_run where id = '{run['id']}'")
    assert int(stored) == 1, "the run is stored in PostgreSQL, not in a SQLite file"
    assert not (server.home / "prefect.db").exists()


def test_the_ingest_trigger_reaches_an_api_behind_basic_authentication(sqlite_prefect: PrefectServer) -> None:
    """Production puts the Prefect API behind basic authentication (PREFECT_SERVER_API_AUTH_STRING),
    as the session's SQLite server is: the ingest service's alert event gets through only with the
    auth string, and a refused one is a clear, retryable error (the alert is answered 503 and
    Alertmanager sends it again)."""
    from datetime import UTC, datetime

    from denpex.ingest.alert_event import AlertEvent
    from denpex.ingest.errors import StoreUnavailableError
    from denpex.ingest.flow_trigger import PrefectEventTrigger

    server = sqlite_prefect
    assert server.auth_string
    incident = f"inc-auth-{uuid.uuid4().hex[:6]}"
    event = AlertEvent(tenant="acme", cluster="lab", job_id="j", incident_id=incident,
                       alert_time=datetime.now(UTC), evidence=f"s3://evidence/acme/lab/j/{incident}",
                       alert_id=f"am-{incident}")
    assert httpx.post(f"{server.api_url}/flow_runs/filter", json={}, timeout=10).status_code == 401
    with pytest.raises(StoreUnavailableError, match="HTTP 401"):
        PrefectEventTrigger(server.api_url).start(event)
    with pytest.raises(StoreUnavailableError, match="HTTP 401"):
        PrefectEventTrigger(server.api_url, auth_string=server.auth_string.split(":")[0] + ":wrong").start(event)
    PrefectEventTrigger(server.api_url, auth_string=server.auth_string).start(event)
    seen: list[str] = []
    deadline = time.monotonic() + 60  # the server stores events a moment after taking them
    with httpx.Client(headers=server.headers, timeout=10) as client:
        while not seen and time.monotonic() < deadline:
            filtered = client.post(f"{server.api_url}/events/filter",
                                   json={"filter": {"event": {"name": ["denpex.alert.nccl-timeout"]}}})
            filtered.raise_for_status()
            seen = [e["payload"]["incident_id"] for e in filtered.json()["events"]
                    if e["payload"]["incident_id"] == incident]
            time.sleep(0.5)
    assert seen == [incident]


def test_the_run_url_the_demo_prints_opens_in_a_browser_not_logged_in(sqlite_prefect: PrefectServer,
                                                                       tmp_path: Path) -> None:
    """Issue 31 item 2: the demo printed the run's own address, which a browser not logged in to a
    UI behind basic authentication shows as "Page not found" (with "Authentication failed"
    toasts). It now prints the login page sent on to the run: a fresh browser logs in there with
    the auth string and lands on the paused run. Screenshots go to the printed folder."""
    from playwright.sync_api import expect, sync_playwright

    from testkit.services.prefect import run_url_through_login

    chromium = Path("/usr/bin/chromium")
    assert chromium.exists(), f"{chromium} is missing: scripts/install_system_deps.sh installs Debian's chromium"
    server = sqlite_prefect
    assert server.auth_string
    name = f"lab/inc-{uuid.uuid4().hex[:8]}"
    flow = _post(server, "/flows/", {"name": "triage"})
    run_id = _post(server, "/flow_runs/", {"flow_id": flow["id"], "name": name,
                                           "state": {"type": "PAUSED", "name": "Paused"}})["id"]
    shots = tmp_path / "screenshots"
    shots.mkdir()
    print(f"screenshots: {shots}")
    expect.set_options(timeout=60_000)  # each wait is for an event; a loaded machine renders slowly
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), headless=True,
                                             args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            # What the demo printed before: the run's own address, in a browser not logged in.
            bare = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            bare.goto(f"{server.url}/runs/flow-run/{run_id}")
            expect(bare.locator("body")).to_contain_text("Page not found")
            bare.screenshot(path=str(shots / "run-url-logged-out.png"))
            # What it prints now.
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.goto(run_url_through_login(server.url, run_id))
            page.screenshot(path=str(shots / "login.png"))
            page.fill("input[type=password]", server.auth_string)
            page.get_by_role("button", name="Login").click()
            page.wait_for_url(f"**/runs/flow-run/{run_id}**")
            expect(page.get_by_text(name).first).to_be_visible()
            expect(page.get_by_text("Paused").first).to_be_visible()
            page.screenshot(path=str(shots / "run-after-login.png"))
        finally:
            browser.close()


def _post(server: PrefectServer, path: str, body: dict[str, object]) -> dict[str, object]:
    """POST to the API; a SQLite server busy with another writer answers 503, which is retried."""
    deadline = time.monotonic() + 120
    while True:
        response = httpx.post(f"{server.api_url}{path}", json=body, headers=server.headers, timeout=30)
        if response.status_code != 503 or time.monotonic() > deadline:
            response.raise_for_status()
            answer: dict[str, object] = response.json()
            return answer
        time.sleep(0.5)
