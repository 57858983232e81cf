"""`make demo`: the incident workflow end to end on this machine, in the foreground.

Starts a local Prefect server on SQLite, a moto S3 server (or uses a folder) for the evidence, a
real Slurm (slurmctld + slurmd + sshd on loopback, the lab the tests use, with the manifest's hosts
as nodes), `flows/serve.py` and the ingest service (`denpex serve-api`); uploads every rank's dump
with a signed request (a host's telemetry with that host's node-agent key), sends the alert through
the Alertmanager webhook, and shows the run reaching the approval pause with its UI URL and the
report. Fresh state under out/demo/<time>/.

    make demo                      # waits for you to approve in the UI (or the printed command)
    make demo DEMO_APPROVE=1       # approves unattended, drains the culprit's node, exits
    make demo DEMO=path/to/folder  # another incident: per-rank dumps, manifest.json, *.log, *.jsonl

Ctrl-C tears everything down. The last line is `report: PATH` (the final report JSON).
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import re
import shutil
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit.services.net import free_port, wait_http  # noqa: E402
from testkit.services.prefect import PrefectServer, wait_for_deployments  # noqa: E402


def _say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def _wait_http(url: str, what: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 90) -> None:
    try:
        wait_http(url, timeout_s, proc, log, interval_s=0.5)
    except RuntimeError as failed:
        raise SystemExit(f"demo: {what} did not come up; its log: {log}\n{failed}") from None


def _spawn(stack: ExitStack, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    handle = log.open("wb")
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                            start_new_session=True)

    def stop() -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        handle.close()

    stack.callback(stop)
    return proc


def _demo_runbooks(folder: Path) -> None:
    """The shipped hang-triage runbook, with the plan-age limit widened for a recorded incident.

    The bundled dumps were recorded on 2026-11-29; the shipped runbook refuses to act on evidence
    older than six hours, which is right for production and would refuse the demo.
    """
    import yaml

    body = yaml.safe_load((ROOT / "runbooks" / "hang-triage.yaml").read_text())
    body["approval"]["max_plan_age"] = "P3650D"
    body["approval"]["approvers"] = ["demo-operator"]  # the shipped runbook names nobody
    body["workflow"].update(evidence_grace="PT10S", coverage_poll="PT1S", approval_poll="PT1S")
    folder.mkdir(parents=True)
    (folder / "hang-triage.yaml").write_text(yaml.safe_dump(body, sort_keys=False))


def _enroll_demo_operator(state: Path, env: dict[str, str]) -> str:
    """Enrol demo-operator's TOTP secret as an operator would (`denpex approver enroll`, which
    prints the otpauth URI and a QR code for an authenticator app); return a shell command that
    prints the current code, for a demo without a phone at hand."""
    subprocess.run([sys.executable, "-m", "denpex", "approver", "enroll", "demo-operator", "--state-dir", str(state)],
                   env=env, check=True)
    program = ("from pathlib import Path; from denpex.isolation.second_factor import TotpStore; "
               f"print(TotpStore(Path({str(state)!r})).current_code('demo-operator'))")
    return f"{sys.executable} -c \"{program}\""


def _alert_time(incident: Path) -> datetime:
    """A few seconds after the newest dump time in the manifest (when the watchdog alerted)."""
    manifest = json.loads((incident / "manifest.json").read_text())
    times = [datetime.fromisoformat(r["dumped_at"].replace("Z", "+00:00"))
             for r in manifest.get("ranks", {}).values() if r.get("dumped_at")]
    return (max(times) if times else datetime.now(UTC)) + timedelta(seconds=6)


def _start_store(stack: ExitStack, run_dir: Path, store: str, env: dict[str, str]) -> str:
    """The evidence store the ingest service writes to: moto's S3 server, or a folder."""
    if store == "folder":
        target = run_dir / "evidence"
        target.mkdir(parents=True)
        return str(target)
    port = free_port()
    moto = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
    log = run_dir / "moto.log"
    proc = _spawn(stack, [moto, "-H", "127.0.0.1", "-p", str(port)], env, log)
    endpoint = f"http://127.0.0.1:{port}"
    _wait_http(endpoint, "moto S3 server", proc, log)
    env["DENPEX_S3_ENDPOINT_URL"] = endpoint
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="demo", aws_secret_access_key="demo")
    client.create_bucket(Bucket="evidence")
    _say(f"evidence store: moto S3 at s3://evidence ({endpoint})")
    return "s3://evidence"


_IDENTITY_FIELDS = ("host", "local_rank", "pid", "gpu_uuid", "gpu_pci_bus_id", "dumped_at")


def _through_the_service(stack: ExitStack, incident: Path, run_dir: Path, store_uri: str, env: dict[str, str],
                         incident_id: str) -> None:
    """Run ``denpex serve-api``; upload every rank's dump with a signed request (each host's telemetry
    with that host's node-agent key) and send the alert through the Alertmanager webhook."""
    from denpex.hardware import parse_telemetry_lines
    from denpex.ingest.client import IngestClient
    from denpex.ingest.plans import PlanTier
    from denpex.ingest.registry import Registry

    registry = Registry(Path(env["DENPEX_STATE_DIR"]))
    registry.add_tenant("acme", PlanTier.DATA_CENTER)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = run_dir / "serve-api.log"
    proc = _spawn(stack, [sys.executable, "-m", "denpex", "serve-api", "--port", str(port), "--store", store_uri],
                  env, log)
    _wait_http(f"{url}/healthz", "denpex serve-api", proc, log)
    manifest = json.loads((incident / "manifest.json").read_text())
    job_id = manifest.get("job_id") or incident.name
    lines_by_host: dict[str, list[str]] = {}
    for path in sorted(incident.iterdir()):
        if path.suffix in (".log", ".jsonl"):
            for line in path.read_text(errors="replace").splitlines():
                events = parse_telemetry_lines([line]).events
                host = events[0].host if events and events[0].host else ""
                lines_by_host.setdefault(host, []).append(line)
    job_key = registry.create_key("acme", "lab")
    ranks = manifest.get("ranks", {})
    _register_layout(IngestClient(url, key_id=job_key.key_id, secret=job_key.secret, tenant="acme", cluster="lab"),
                     job_id, manifest)
    uploaded = 0
    for rank in range(manifest["world_size"]):
        dump = next((p for p in (incident / f"rank_{rank}.pkl", incident / f"rank_{rank}.json") if p.is_file()), None)
        if dump is None:
            continue
        uploaded += 1
        ident = {k: v for k, v in ranks.get(str(rank), {}).items() if k in _IDENTITY_FIELDS}
        host = ident.get("host")
        telemetry = lines_by_host.pop(host, []) if host else []
        # A host's own telemetry travels with a key bound to that host (a node agent's): only such
        # telemetry may support a drain. The demo issues one per host that has telemetry.
        key = registry.create_key("acme", "lab", host=host) if telemetry and host else job_key
        client = IngestClient(url, key_id=key.key_id, secret=key.secret, tenant="acme", cluster="lab")
        identity = {**ident, "job_id": job_id, "incident_id": incident_id, "rank": rank,
                    "world_size": manifest["world_size"], "process_groups": manifest.get("process_groups", {})}
        body = [("\n".join(telemetry) + "\n").encode()] if telemetry else []
        response = client.upload(identity, dump.read_bytes(), dump.name, body)
        if response.status_code >= 300:
            raise SystemExit(f"demo: the upload of rank {rank} was refused: {response.text}")
    for host, telemetry in sorted(lines_by_host.items()):
        if not host:
            continue
        # A host whose rank left no dump (it died): its node agent sends the kernel log alone.
        key = registry.create_key("acme", "lab", host=host)
        agent = IngestClient(url, key_id=key.key_id, secret=key.secret, tenant="acme", cluster="lab")
        response = agent.upload_telemetry({"job_id": job_id, "incident_id": incident_id},
                                          [("\n".join(telemetry) + "\n").encode()])
        if response.status_code >= 300:
            raise SystemExit(f"demo: the telemetry of {host} was refused: {response.text}")
        _say(f"{host} left no dump; its node agent sent its kernel log alone")
    _say(f"uploaded {uploaded} of {manifest['world_size']} ranks' dumps with signed requests to {url} "
         f"-> {store_uri}/acme/lab/{job_id}/{incident_id}")
    time.sleep(1.5)  # the service writes the incident's manifest.json within a second
    token = registry.create_token("acme", "lab")
    alert = {"version": "4", "status": "firing", "receiver": "denpex", "alerts": [{
        "status": "firing", "startsAt": _alert_time(incident).isoformat().replace("+00:00", "Z"),
        "labels": {"alertname": "NCCLWatchdogTimeout", "tenant": "acme", "cluster": "lab", "job_id": job_id,
                   "incident_id": incident_id, "rank": "0", "world_size": str(manifest["world_size"])}}]}
    request = urllib.request.Request(f"{url}/v1/alerts", data=json.dumps(alert).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {token.token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 (our loopback service)
        receipt = json.loads(answer.read())
    _say(f"alert through the Alertmanager webhook: {receipt['alerts'][0]}")


_REGISTERED_FIELDS = ("host", "local_rank", "pid", "gpu_uuid", "gpu_pci_bus_id", "gpu_index")


def _register_layout(client: Any, job_id: str, manifest: dict[str, Any]) -> None:
    """What the job's collectors do at start: register where every rank runs
    (``POST /v1/jobs/{job_id}/ranks``), so that a rank that later dies without a dump still has a host."""
    ranks = {rank: {k: v for k, v in entry.items() if k in _REGISTERED_FIELDS}
             for rank, entry in manifest.get("ranks", {}).items() if entry.get("host")}
    if not ranks:
        return
    response = client.register(job_id, {"world_size": manifest["world_size"], "ranks": ranks,
                                         "process_groups": manifest.get("process_groups", {})})
    if response.status_code >= 300:
        raise SystemExit(f"demo: the job's registration was refused: {response.text}")
    _say(f"registered job {job_id}'s layout ({len(ranks)} ranks) as its collectors would at start")


def _start_slurm(stack: ExitStack, incident: Path) -> Any:
    from testkit.services.slurm import SlurmLab

    manifest = json.loads((incident / "manifest.json").read_text())
    hosts = sorted({r.get("host") for r in manifest.get("ranks", {}).values() if r.get("host")})
    # 16 nodes as in the tests: draining one stays inside the runbook's 10% blast radius.
    lab = SlurmLab(Path(tempfile.mkdtemp(prefix="denpex-demo-lab-")), node_count=max(16, len(hosts)))
    missing = [h for h in hosts if h not in lab.nodes]
    if missing:
        raise SystemExit(f"demo: the local Slurm names its nodes gpu-node-001..; the manifest's hosts "
                         f"{missing} are not among them")
    lab.start()
    stack.callback(lambda: (lab.stop(), shutil.rmtree(lab.root, ignore_errors=True)))
    _say(f"slurm: slurmctld + {len(lab.nodes)} slurmd + sshd on 127.0.0.1:{lab.ssh_port} (ClusterName=lab)")
    return lab


def _register_blocks(lab: Any) -> None:
    from blocks import DenpexRunbook, DenpexSlurmTarget, DenpexSshCredentials
    from blocks.register import register_block_types

    register_block_types()
    DenpexRunbook(name="hang-triage").save("default", overwrite=True)
    creds = DenpexSshCredentials(username="root", private_key=lab.client_key.read_text(),
                                 known_hosts=lab.known_hosts.read_text())
    DenpexSlurmTarget(cluster_name="lab", host="127.0.0.1", port=lab.ssh_port, credentials=creds).save(
        "lab", overwrite=True)


def _wait_for_trigger(api: str, served: subprocess.Popen[bytes], log: Path, timeout_s: float = 180, *,
                      headers: dict[str, str]) -> None:
    """An event sent before the deployment's trigger exists starts nothing: wait for the automation."""
    try:
        wait_for_deployments(api, ["on-alert"], served, log, timeout_s, automations=["denpex-alert"],
                             headers=headers)
    except RuntimeError as failed:
        raise SystemExit(f"demo: the alert trigger was not registered; see {log}\n{failed}") from None


def _find_run(incident_id: str, timeout_s: float = 120) -> Any:
    from prefect import get_client

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            for run in client.read_flow_runs(limit=50):
                if run.parameters.get("incident_id") == incident_id:
                    return run.id
            time.sleep(1)
    raise SystemExit(f"demo: no flow run started for incident {incident_id} within {timeout_s:.0f} s")


def _wait_state(run_id: Any, wanted: set[str], timeout_s: float | None = 600) -> str:
    from prefect import get_client

    deadline = time.monotonic() + timeout_s if timeout_s else None
    with get_client(sync_client=True) as client:
        while deadline is None or time.monotonic() < deadline:
            state = client.read_flow_run(run_id).state
            kind = state.type.value if state else ""
            if kind in wanted:
                return kind
            if kind in {"FAILED", "CRASHED", "CANCELLED"}:
                raise SystemExit(f"demo: the run ended {kind}: {state.message if state else ''}")
            time.sleep(1)
    raise SystemExit(f"demo: the run did not reach {wanted} in time")


# The alt text is escaped markdown (denpex.markdown_text.inline): brackets inside it are "\]".
_INLINE_PNG = re.compile(r"!\[((?:\\.|[^\]\\])*)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)")


def _show_report(incident_id: str, run_dir: Path) -> None:
    """The report artifact's markdown; its inline charts are written to PNG files and named by path
    (the UI renders them; a terminal would print kilobytes of base64)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        for artifact in client.read_artifacts(limit=50):
            if artifact.key == f"denpex-{incident_id}-report":
                print(_charts_to_files(str(artifact.data), run_dir / "charts"), flush=True)
                return


def _charts_to_files(markdown: str, folder: Path) -> str:
    numbers = itertools.count(1)

    def to_file(match: re.Match[str]) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"chart-{next(numbers)}.png"
        path.write_bytes(base64.b64decode(match.group(2)))
        return f"[{match.group(1) or 'chart'}: {path}]"

    return _INLINE_PNG.sub(to_file, markdown)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("incident", nargs="?", default=str(ROOT / "examples" / "incident-xid79"))
    parser.add_argument("--approve", action="store_true", help="approve unattended (DEMO_APPROVE=1)")
    parser.add_argument("--store", choices=["s3", "folder"], default="s3")
    parser.add_argument("--out", default=str(ROOT / "out" / "demo"))
    args = parser.parse_args(argv)
    incident = Path(args.incident).resolve()
    if not (incident / "manifest.json").is_file():
        raise SystemExit(f"demo: {incident} has no manifest.json; an incident folder holds per-rank dumps, "
                         "manifest.json and optional *.log / *.jsonl telemetry")
    run_dir = Path(args.out).resolve() / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir.mkdir(parents=True)
    # The Prefect server the tests use (testkit.services.prefect): SQLite in run_dir/prefect-home,
    # its output in run_dir/prefect-server.log, the UI told its API URL.
    # The API behind basic authentication, as production puts it (or behind an authenticating
    # proxy): every client (flows, the ingest service, this script) sends the auth string.
    prefect = PrefectServer(run_dir, startup_timeout=90, auth_string=f"demo:{secrets.token_urlsafe(12)}")
    api = prefect.api_url
    env = prefect.env(PREFECT_UI_URL=prefect.url, PREFECT_LOGGING_LEVEL="WARNING",
                      DENPEX_STATE_DIR=str(run_dir / "state"), DENPEX_RUNBOOKS_DIR=str(run_dir / "runbooks"),
                      AWS_ACCESS_KEY_ID="demo", AWS_SECRET_ACCESS_KEY="demo", AWS_DEFAULT_REGION="us-east-1")
    _demo_runbooks(run_dir / "runbooks")
    code_command = _enroll_demo_operator(run_dir / "state", env)
    with ExitStack() as stack:
        _say(f"state: {run_dir}")
        stack.callback(prefect.stop)
        try:
            prefect.start()
        except RuntimeError as failed:
            raise SystemExit(f"demo: the prefect server did not start; its log: {prefect.log}\n{failed}") from None
        _say(f"prefect server (SQLite under {prefect.home}): {prefect.url} (the UI's login asks for the API's "
             f"auth string: {prefect.auth_string})")
        store_uri = _start_store(stack, run_dir, args.store, env)
        os.environ.update(env)  # this process talks to the same API and store from here on
        lab = _start_slurm(stack, incident)
        _register_blocks(lab)
        served = _spawn(stack, [sys.executable, "-m", "flows.serve"], env, run_dir / "serve.log")
        incident_id = f"demo-{run_dir.name.lower()}"
        _wait_for_trigger(api, served, run_dir / "serve.log", headers=prefect.headers)
        _through_the_service(stack, incident, run_dir, store_uri, env, incident_id)
        run_id = _find_run(incident_id)
        ui = f"{prefect.url}/runs/flow-run/{run_id}"
        state = _wait_state(run_id, {"PAUSED", "COMPLETED"})
        _show_report(incident_id, run_dir)
        if state == "PAUSED":
            plan = json.loads((run_dir / "state" / "plans" / f"{incident_id}.json").read_text())
            from denpex.isolation.plan import IsolationPlan

            digest = IsolationPlan.model_validate(plan).content_hash()
            nodes = [a["node"] for a in plan["actions"]]
            answer = {"decision": "approve", "plan_hash": digest, "nodes": nodes, "approver": "demo-operator",
                      "comment": "approved by make demo"}
            _say(f"PAUSED for approval: {ui}")
            if args.approve:
                from prefect.flow_runs import resume_flow_run

                from denpex.isolation.second_factor import TotpStore

                # What demo-operator's authenticator app shows now.
                code = TotpStore(run_dir / "state").current_code("demo-operator")
                resume_flow_run(run_id, run_input={**answer, "code": code})
                _say(f"approved {', '.join(nodes)} as demo-operator with their current TOTP code (DEMO_APPROVE=1)")
            else:
                body = json.dumps({"run_input": {**answer, "code": "CODE"}}).replace('"CODE"', '"\'"$CODE"\'"')
                _say("approve in the UI (Resume; choose demo-operator and type the code from the authenticator "
                     f"app that scanned the QR code above, or the one this prints: {code_command}), or with:\n"
                     f"  CODE=$({code_command}); curl -s -u '{prefect.auth_string}' -X POST "
                     f"{api}/flow_runs/{run_id}/resume -H 'Content-Type: application/json' -d '{body}'\n"
                     "Ctrl-C stops the demo.")
            _wait_state(run_id, {"COMPLETED"}, timeout_s=None if not args.approve else 600)
        reports = sorted((run_dir / "state" / "reports").glob(f"{incident_id}-*.json"))
        final = json.loads(reports[-1].read_text())
        _say(f"outcome: {final['outcome']}: {final['reason']}")
        for node in (final.get("execution") or {}).get("nodes", []):
            line = lab.node_line(node["node"])
            state = next((t for t in line.split() if t.startswith("State=")), "State=?")
            reason = line.split(" Reason=", 1)[1].strip() if " Reason=" in line else ""
            _say(f"slurm: {node['node']} {state} Reason={reason}")
        audit = run_dir / "state" / "audit.jsonl"
        if audit.exists():
            _say(f"audit log {audit}:")
            print(audit.read_text(), end="", flush=True)
    # Printed once everything is torn down, so that it stays the last line of the output whatever
    # the teardown prints (callers, CI among them, read the report's path from the last line).
    print(f"report: {reports[-1]}", flush=True)
    # Unattended (CI) runs must end with the culprit's node drained.
    return 0 if not args.approve or final["outcome"] == "executed" else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("\n[demo] stopped; everything was torn down", flush=True)
        sys.exit(130)
