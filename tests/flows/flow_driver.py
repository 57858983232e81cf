"""Driving the served incident flow from a test: start it, find its run, answer it, read its report."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from denpex.ingest.alert_event import AlertEvent, emit_alert
from denpex.ingest.layout import incident_prefix
from denpex.isolation.audit import AuditLog, verify_audit_log
from denpex.isolation.operator import state_audit_log
from denpex.isolation.plan import IsolationPlan, load_plan
from denpex.isolation.second_factor import TotpStore
from testkit.services.approval_page import decide
from testkit.services.slurm import SlurmLab



@dataclass
class FlowRig:
    """What a flow test needs: the API, where state and runbooks are, the S3 endpoint, the lab."""

    api_url: str
    state_dir: Path
    runbooks: Path
    s3_endpoint: str
    lab: SlurmLab
    served: subprocess.Popen[bytes]
    serve_log: Path
    page_url: str | None = None
    """The approval page the rig's runs are decided on (``denpex serve-approvals``)."""


ALERT_TIME = datetime(2026, 11, 29, 20, 29, 50, tzinfo=UTC)
CULPRIT_NODE = "gpu-node-003"  # withheld_one: rank 2 never enters its tp all_reduce
GPU = "0000:3b:00.0"


def manifest_with_gpus(folder: Path) -> bytes:
    manifest = json.loads((folder / "manifest.json").read_text())
    for identity in manifest["ranks"].values():
        identity["gpu_pci_bus_id"] = GPU
    return json.dumps(manifest).encode()


C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
CULPRIT_STACK = "data.py:45 next\\_batch\\(\\) ← train.py:80 step\\(\\)"
"""The culprit's short stack as the dialog brief writes it (escaped markdown)."""


def withheld_one_stacks() -> dict[str, bytes]:
    """The collector's stacks files for withheld_one, as HangDumper writes them beside its dumps:
    ranks 0, 1, 3 in an all_reduce called from ``train.py:88 step()``, rank 2 in its data loader."""
    def one(rank: int, frames: list[tuple[str, int, str]]) -> bytes:
        return json.dumps({"format": "denpex.stacks/1", "rank": rank, "source": "collector",
                           "taken_at": "2026-11-29T20:29:44Z", "threads": [{"name": "MainThread", "frames": [
                               {"file": f, "line": n, "function": fn} for f, n, fn in frames]}]}).encode()
    waiting = [(C10D, 3252, "all_reduce"), ("/job/train.py", 88, "step"), ("/job/train.py", 120, "main")]
    files = {f"collector/rank_{r}.stacks.json": one(r, waiting) for r in (0, 1, 3)}
    files["collector/rank_2.stacks.json"] = one(2, [("/job/data.py", 45, "next_batch"), ("/job/train.py", 80, "step"),
                                                     ("/job/train.py", 120, "main")])
    return files


def form_texts(run_id: object) -> str:
    """Every input Prefect keeps for the paused run: the form's schema and its description (the
    stored JSON decoded, so the markdown reads as the dialog gets it)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        found = client.filter_flow_run_input(flow_run_id=run_id, key_prefix="", limit=100, exclude_keys=set())
    return "\n".join(str(json.loads(i.value)) for i in found)


def xid79_log(node: str = CULPRIT_NODE) -> bytes:
    """Xid 79 (GPU fallen off the bus) on ``node`` a minute before the alert."""
    return (f"2026-11-29T20:28:50+0000 {node} kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, "
            "GPU has fallen off the bus.\n").encode()


_NAMES = dict(tenant="acme", cluster="lab", job_id="gloo-withheld_one")


def evidence_prefix(incident_id: str, **overrides: str) -> str:
    """Where the ingest service stores the incident ``alert(incident_id, ..., **overrides)`` names:
    the flow triages only that folder (``check_evidence_binding``)."""
    names = {**_NAMES, **overrides}
    return incident_prefix(names["tenant"], names["cluster"], names["job_id"], incident_id)


def alert(incident_id: str, evidence: str, **overrides: Any) -> AlertEvent:
    fields: dict[str, Any] = dict(**_NAMES, incident_id=incident_id,
                                  alert_time=ALERT_TIME, evidence=evidence, world_size=4, reported_by_rank=0,
                                  alert_id=f"am-{incident_id}")
    fields.update(overrides)
    return AlertEvent(**fields)


def fire(api_url: str, event: AlertEvent) -> None:
    emit_alert(api_url, event, occurred=datetime.now(UTC))


def start_manual(event: AlertEvent) -> UUID:
    from prefect.deployments import run_deployment

    run = run_deployment("denpex-triage/manual", parameters=event.model_dump(mode="json"), timeout=0)
    return run.id


def find_run(incident_id: str, *, timeout_s: float = 120) -> UUID:
    """The flow run whose parameters name ``incident_id`` (started by the event trigger)."""
    from prefect import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            # Newest first: the session's server also holds the replay and Dask tests' runs.
            for run in client.read_flow_runs(limit=200, sort=FlowRunSort.EXPECTED_START_TIME_DESC):
                if run.parameters.get("incident_id") == incident_id:
                    return run.id
            time.sleep(1)
    raise AssertionError(f"no flow run for incident {incident_id} within {timeout_s} s")


def wait_for(run_id: UUID, wanted: set[str], *, timeout_s: float = 240) -> str:
    """Wait until the run's state type is one of ``wanted`` (PAUSED, COMPLETED, ...)."""
    from prefect import get_client

    deadline = time.monotonic() + timeout_s
    seen = ""
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            state = client.read_flow_run(run_id).state
            seen = state.type.value if state else ""
            if seen in wanted:
                return seen
            if seen in {"FAILED", "CRASHED", "CANCELLED"} - wanted:
                raise AssertionError(f"run {run_id} ended {seen}: {state.message if state else ''}")
            time.sleep(0.5)
    raise AssertionError(f"run {run_id} did not reach {wanted} within {timeout_s} s (last {seen})")


def state_message(run_id: UUID) -> str:
    """The message of the run's current state ("" when it has none)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state
    return state.message or "" if state else ""


def saved_plan(state_dir: Path, incident_id: str) -> IsolationPlan:
    """The incident's plan, wherever its tenant and cluster keyed it (``plans/<tenant>/<cluster>/``)."""
    [path] = (state_dir / "plans").glob(f"*/*/{incident_id}.json")
    return load_plan(path)


PAGES: dict[Path, str] = {}
"""The approval page that decides the runs of each state directory (``use_page``)."""


def use_page(state_dir: Path, url: str) -> None:
    """From now on ``resume(..., state_dir=state_dir)`` decides on the page at ``url``."""
    PAGES[state_dir] = url


APPROVERS = ("alice", "bob", "carol")
"""The test runbooks' approvers (``write_runbooks``), each enrolled with a real TOTP secret."""
_STEP_S = 30
_codes_given: dict[tuple[Path, str], int] = {}


def enroll_approvers(state_dir: Path, names: tuple[str, ...] = APPROVERS) -> None:
    """Enrol ``names`` in the state directory, as `denpex approver enroll NAME` does."""
    store = TotpStore(state_dir)
    for name in names:
        if not store.enrolled(name):
            store.enroll(name)


def totp_code(state_dir: Path, approver: str) -> str:
    """The code ``approver``'s authenticator shows now. A code is accepted once, so when this
    process already handed out this 30 s step's code, wait for the next step."""
    key = (state_dir, approver)
    now = time.time()
    step = int(now) // _STEP_S
    if _codes_given.get(key, -1) >= step:
        time.sleep((step + 1) * _STEP_S - now + 0.5)
        now = time.time()
        step = int(now) // _STEP_S
    _codes_given[key] = step
    return TotpStore(state_dir).current_code(approver, at=now)


def resume(run_id: UUID, answer: dict[str, Any], *, state_dir: Path | None = None) -> None:
    """Answer the paused run: on the approval page where ``state_dir`` has one (``use_page``),
    else through the Prefect form. With ``state_dir``, an answer without a ``code`` gets the
    approver's current one (a person typing it from their authenticator)."""
    from prefect.flow_runs import resume_flow_run

    if state_dir is not None and answer.get("decision") in {"approve", "reject"} and "code" not in answer:
        answer = {**answer, "code": totp_code(state_dir, str(answer.get("approver", "")).strip())}
    if state_dir is not None and state_dir in PAGES:
        response = decide(PAGES[state_dir], run_id, decision=str(answer["decision"]),
                          approver=str(answer.get("approver", "")), code=str(answer.get("code", "")),
                          nodes=answer.get("nodes"), comment=str(answer.get("comment", "")))
        assert response.status_code == 303, f"{response.status_code}: {response.text[-2000:]}"
        return
    resume_flow_run(run_id, run_input=answer)


def report_of(state_dir: Path, incident_id: str, run_id: UUID) -> dict[str, Any]:
    """The run's final report (``reports/<tenant>/<cluster>/<incident>-<run>.json``)."""
    deadline = time.monotonic() + 90
    while True:
        found = list((state_dir / "reports").glob(f"*/*/{incident_id}-{run_id}.json"))
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    [path] = found
    return json.loads(path.read_text())


def keyed_audit_log(state_dir: Path) -> AuditLog:
    """The state directory's audit log, checked as the next execution checks it: with its key."""
    log = state_audit_log(state_dir)
    verification = verify_audit_log(log.path, key=log.key)
    assert verification.ok, verification.problems
    return log
