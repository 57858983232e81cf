"""The incident flow against `prefect server start` on a real PostgreSQL, as in production.

The session's server on PostgreSQL (tests/plugins/services.py), the deployments served against it,
dumps in moto S3 (HTTP), the real Slurm lab over real SSH. First the approve path through the
API; then the approval through the real UI in headless Debian Chromium (Playwright, never a
downloaded browser): the paused run found on /runs, the plan and the chart seen beside the form,
the form filled and submitted, the run completed, the node drained. Screenshots go under the
test's tmp_path and their paths are printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import AWS_ENV, FIXTURES, ROOT, register_blocks, upload, write_runbooks
from denpex.isolation.audit import AuditKind
from flow_driver import (
    CULPRIT_NODE,
    FlowRig,
    alert,
    enroll_approvers,
    find_run,
    fire,
    keyed_audit_log,
    manifest_with_gpus,
    report_of,
    resume,
    saved_plan,
    totp_code,
    wait_for,
    xid79_log,
)
from lab.rig import drained_nodes
from plugins.services import PostgresPrefect
from testkit.services.postgres import psql
from testkit.services.prefect import PrefectServer, flow_run, wait_for_deployments
from testkit.services.slurm import SlurmLab

# Sized to what it starts: PostgreSQL, `prefect server start`, served flows, Chromium.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SCENARIO = FIXTURES / "withheld_one"


@dataclass
class ServerRig:
    """The flow rig plus the real server it runs against and its database URL."""

    flows: FlowRig
    server: PrefectServer
    database_url: str


@pytest.fixture(scope="module")
def pg_rig(postgres_prefect: PostgresPrefect, s3_endpoint: str, slurm_lab: SlurmLab,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerRig]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    work = tmp_path_factory.mktemp("pg-rig")
    state, runbooks, log = work / "state", work / "runbooks", work / "serve.log"
    state.mkdir()
    write_runbooks(runbooks)
    enroll_approvers(state)
    server, database_url = postgres_prefect.server, postgres_prefect.database_url
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        register_blocks(slurm_lab)
        env = {**server.env(), **AWS_ENV, "DENPEX_STATE_DIR": str(state), "DENPEX_RUNBOOKS_DIR": str(runbooks),
               "DENPEX_S3_ENDPOINT_URL": s3_endpoint}
        with log.open("wb") as out:
            served = subprocess.Popen([sys.executable, "-m", "flows.serve"], cwd=ROOT, env=env,
                                      stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_deployments(server.api_url, ["on-alert", "manual", "return-to-service"], served, log,
                                 automations=["denpex-alert"])
            yield ServerRig(FlowRig(server.api_url, state, runbooks, s3_endpoint, slurm_lab, served, log),
                            server, database_url)
        finally:
            # The flow runs stop before the server does (a server stopping under a paused run crashes it).
            served.terminate()
            try:
                served.wait(timeout=20)
            except subprocess.TimeoutExpired:
                served.kill()


def paused_incident(rig: ServerRig, incident: str) -> Any:
    [run_id] = paused_incidents(rig, incident)
    return run_id


def paused_incidents(rig: ServerRig, *incidents: str) -> list[Any]:
    """Fire an alert per incident, then wait for every run to pause (they triage side by side)."""
    for incident in incidents:
        evidence = upload(rig.flows.s3_endpoint, incident, SCENARIO,
                          extra={"manifest.json": manifest_with_gpus(SCENARIO), "kernel.log": xid79_log()})
        fire(rig.server.api_url, alert(incident, evidence))
    run_ids = [find_run(incident) for incident in incidents]
    for run_id in run_ids:
        assert wait_for(run_id, {"PAUSED"}) == "PAUSED"
    return run_ids


def assert_drained_and_audited(rig: ServerRig, lab: SlurmLab, incident: str, run_id: Any, approver: str) -> None:
    report = report_of(rig.flows.state_dir, incident, run_id)
    assert report["outcome"] == "executed", report["reason"]
    assert report["approval"]["approver"] == approver and report["approval"]["channel"] == "prefect-ui"
    assert drained_nodes(lab) == {CULPRIT_NODE}
    audit = keyed_audit_log(rig.flows.state_dir)
    assert [r.kind for r in audit.records() if r.incident_id == incident] == [AuditKind.INTENT, AuditKind.RESULT]


def test_approve_path_on_a_postgres_backed_server(pg_rig: ServerRig, lab: SlurmLab) -> None:
    incident = "pg-approve"
    run_id = paused_incident(pg_rig, incident)
    plan = saved_plan(pg_rig.flows.state_dir, incident)
    assert drained_nodes(lab) == set()
    resume(run_id, {"decision": "approve", "plan_hash": plan.content_hash(), "nodes": [CULPRIT_NODE],
                    "approver": "alice", "comment": "Xid 79 confirmed"}, state_dir=pg_rig.flows.state_dir)
    assert wait_for(run_id, {"COMPLETED"}) == "COMPLETED"
    assert_drained_and_audited(pg_rig, lab, incident, run_id, "alice")
    assert psql(pg_rig.database_url, f"select state_type from flow_run where id = '{run_id}'") == "COMPLETED"


def test_approval_through_the_real_ui_in_headless_chromium(pg_rig: ServerRig, lab: SlurmLab,
                                                           tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: scripts/install_system_deps.sh installs Debian's chromium"
    incident, replay = "ui-approve", "ui-reused-code"
    run_id, replay_run_id = paused_incidents(pg_rig, incident, replay)
    run_name = flow_run(pg_rig.server, str(run_id))["name"]
    ui = pg_rig.server.url
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.set_default_timeout(30_000)
            page.goto(f"{ui}/runs")
            page.get_by_role("link", name=run_name, exact=True).first.click()
            page.wait_for_url(f"**/runs/flow-run/{run_id}")
            expect(page.locator(".state-badge").filter(has_text="Paused").first).to_be_visible()
            paused_shot = tmp_path / "paused-run.png"
            page.screenshot(path=str(paused_shot))

            page.get_by_role("button", name="Resume", exact=True).click()
            dialog = page.get_by_role("dialog")
            expect(dialog.get_by_text("Resume Flow Run")).to_be_visible()
            expect(dialog.get_by_role("heading", name=f"Incident {incident} on lab: localized")).to_be_visible()
            expect(dialog.get_by_text(f"drain {CULPRIT_NODE}").first).to_be_visible()
            # The chart beside the form: decoded images (naturalWidth > 0 only once the PNG decoded).
            dialog.locator("img").first.wait_for()
            page.wait_for_function("() => [...document.querySelectorAll('[role=dialog] img')]"
                                   ".some(i => i.complete && i.naturalWidth > 0)")
            widths = dialog.locator("img").evaluate_all("els => els.map(e => e.naturalWidth)")
            assert widths and all(w > 0 for w in widths), widths
            dialog.locator("img").first.scroll_into_view_if_needed()
            chart_shot = tmp_path / "approval-chart.png"
            page.screenshot(path=str(chart_shot))
            print(f"screenshot: {chart_shot}")

            def field(label: str) -> Any:
                return dialog.locator(".schema-form-property").filter(
                    has=page.locator(".schema-form-property__label", has_text=label))

            # The decision is a select: open it from the keyboard (a click only focuses it here).
            field("Decision").locator(".p-select-button__control").click()
            page.keyboard.press("ArrowDown")
            page.get_by_role("option", name="approve", exact=True).click()
            # The approver is a choice among the runbook's approvers; the code is carol's, as her
            # authenticator app shows it now.
            field("Approver").locator(".p-select-button__control").click()
            page.keyboard.press("ArrowDown")
            page.get_by_role("option", name="carol", exact=True).click()
            code = totp_code(pg_rig.flows.state_dir, "carol")
            field("Code").locator("textarea").fill(code)
            field("Comment").locator("textarea").fill("approved in the browser")
            form_shot = tmp_path / "approval-form.png"
            page.screenshot(path=str(form_shot))
            print(f"screenshots: {paused_shot} {form_shot}")
            dialog.get_by_role("button", name="Submit", exact=True).click()
            expect(dialog).to_be_hidden(timeout=60_000)  # it validates, then resumes: slow on a busy box
            assert wait_for(run_id, {"COMPLETED"}) == "COMPLETED"
            expect(page.locator(".state-badge").filter(has_text="Completed").first).to_be_visible(timeout=30_000)
            done_shot = tmp_path / "completed-run.png"
            page.screenshot(path=str(done_shot))
            print(f"screenshot: {done_shot}")
        finally:
            browser.close()
    assert_drained_and_audited(pg_rig, lab, incident, run_id, "carol")
    assert report_of(pg_rig.flows.state_dir, incident, run_id)["approval"]["second_factor"] == "totp"
    assert os.path.getsize(paused_shot) > 10_000 and os.path.getsize(form_shot) > 10_000

    # Whoever saw carol's code (over her shoulder, in the run's stored input) cannot use it again.
    plan = saved_plan(pg_rig.flows.state_dir, replay)
    resume(replay_run_id, {"decision": "approve", "plan_hash": plan.content_hash(), "nodes": [CULPRIT_NODE],
                           "approver": "carol", "code": code, "comment": "replayed"})
    assert wait_for(replay_run_id, {"COMPLETED"}) == "COMPLETED"
    refused = report_of(pg_rig.flows.state_dir, replay, replay_run_id)
    assert refused["outcome"] == "refused" and "carol's code was already used" in refused["reason"]
    assert refused["execution"] is None
    assert not [r for r in keyed_audit_log(pg_rig.flows.state_dir).records()
                if r.incident_id == replay and r.kind is not AuditKind.DECISION]
