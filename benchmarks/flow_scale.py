"""The incident flow at scale and its alert-to-pause latency, measured end to end.

1. **Scale**: a synthetic 4,096-rank x 2,000-entry dump set (``testkit.generators.expansion``, as in
   ``triage_scale.py``) is uploaded to moto S3 (HTTP server mode) with a kernel log holding an
   Xid 79 on the culprit's node. On the same ``s3://`` URI, in the same run:
   - ``denpex triage s3://... --format json`` (a fresh process; its wall time);
   - the incident flow (``flows/triage.py:triage``) in a fresh process against a real
     ``prefect server start`` (SQLite), from process start until the run is PAUSED for approval.
2. **Latency**: a real 4-rank Gloo incident (``tests/fixtures/gloo/withheld_one``) in S3; the
   deployments served with ``python -m flows.serve``; the alert event fired through
   ``POST /api/events``; time until the run is PAUSED. Once with Prefect's default runner polling,
   once with ``PREFECT_RUNNER_POLL_FREQUENCY=1``, and once more with 1 s polling and each run
   started in a fresh interpreter (``--spawn-runs``) instead of forked from a preloaded server
   (flows/forked_runs.py).

Nothing is remediated: the Slurm target block points at a closed port and every run is cancelled
at the pause. Figures print as a table and go to ``--out`` as JSON::

    .venv/bin/python benchmarks/flow_scale.py --out /tmp/flow_scale.json
    .venv/bin/python benchmarks/flow_scale.py --ranks 512 --skip-latency     # a quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import httpx
import yaml
from moto.server import ThreadedMotoServer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from denpex.ingest.layout import incident_prefix  # noqa: E402
from denpex.workflow.flow_parameters import EVIDENCE_ROOT_ENV  # noqa: E402
from testkit.services.prefect import PrefectServer, prefect_server, wait_for_deployments  # noqa: E402

TEMPLATE = REPO / "benchmarks" / "templates" / "gloo_rank0_2000.pkl.gz"
GLOO = REPO / "tests" / "fixtures" / "gloo" / "withheld_one"
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
BUCKET = "evidence"
CLUSTER = "bench"


def gpu_bus(local_rank: int) -> str:
    """One GPU per local rank, so that an Xid names one rank's GPU, not the whole node's."""
    return f"0000:{0x3b + local_rank:02x}:00.0"


def xid79(node: str, at: datetime, local_rank: int = 0) -> bytes:
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S+0000")
    return (f"{stamp} {node} kernel: NVRM: Xid (PCI:{gpu_bus(local_rank)[:-2]}): 79, pid=4242, "
            "GPU has fallen off the bus.\n").encode()


def upload_folder(endpoint: str, prefix: str, folder: Path, extra: dict[str, bytes]) -> str:
    """Every dump (pickles only; the JSON twins would double the work) and ``extra`` files."""
    files = [p for p in sorted(folder.iterdir())
             if p.is_file() and p.suffix != ".json" and p.name not in extra]

    def put(path: Path) -> None:
        boto3.client("s3", endpoint_url=endpoint).put_object(Bucket=BUCKET, Key=f"{prefix}/{path.name}",
                                                              Body=path.read_bytes())
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, files))
    client = boto3.client("s3", endpoint_url=endpoint)
    for name, body in extra.items():
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{name}", Body=body)
    return f"s3://{BUCKET}/{prefix}"


def manifest_with_gpus(folder: Path) -> bytes:
    manifest = json.loads((folder / "manifest.json").read_text())
    for identity in manifest["ranks"].values():
        identity["gpu_pci_bus_id"] = gpu_bus(int(identity.get("local_rank", 0)))
    return json.dumps(manifest).encode()


def run_cli(uri: str, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).parent / "denpex"), "triage", uri, "--format", "json"],
                          env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"denpex triage failed: {done.stderr[-2000:]}")
    return wall, json.loads(done.stdout)


def write_runbook(folder: Path) -> None:
    """The shipped runbook, allowing replayed evidence (recorded long ago) and a short grace."""
    body = yaml.safe_load((REPO / "runbooks" / "hang-triage.yaml").read_text())
    body["approval"]["max_plan_age"] = "P3650D"
    body["workflow"] = {**body["workflow"], "evidence_grace": "PT5S", "coverage_poll": "PT1S",
                        "approval_timeout": "PT600S", "approval_poll": "PT1S"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hang-triage.yaml").write_text(yaml.safe_dump(body))


def register_blocks(server: PrefectServer) -> None:
    """A runbook block and a Slurm target at a closed port: planning works, nothing can run."""
    code = (
        "from blocks import DenpexRunbook, DenpexSlurmTarget, DenpexSshCredentials\n"
        "DenpexRunbook(name='hang-triage').save('default', overwrite=True)\n"
        "creds = DenpexSshCredentials(username='nobody', private_key='not-a-key', known_hosts='')\n"
        f"DenpexSlurmTarget(cluster_name='{CLUSTER}', host='127.0.0.1', port=9, credentials=creds)"
        f".save('{CLUSTER}', overwrite=True)\n")
    subprocess.run([sys.executable, "-c", code], env=server.env(), cwd=REPO, check=True, timeout=120)


def runs_of(server: PrefectServer, incident: str) -> list[dict[str, Any]]:
    response = httpx.post(f"{server.api_url}/flow_runs/filter", json={"limit": 200}, timeout=10)
    response.raise_for_status()
    return [r for r in response.json() if (r.get("parameters") or {}).get("incident_id") == incident]


def wait_paused(server: PrefectServer, incident: str, started: float, timeout: float) -> float:
    """Seconds from ``started`` until the incident's run is PAUSED; raises if it ends otherwise."""
    while time.perf_counter() - started < timeout:
        for run in runs_of(server, incident):
            if run["state_type"] == "PAUSED":
                return time.perf_counter() - started
            if run["state_type"] in {"FAILED", "CRASHED", "CANCELLED", "COMPLETED"}:
                raise RuntimeError(f"run for {incident} ended {run['state_type']}: {run['state']['message']}")
        time.sleep(0.2)
    raise TimeoutError(f"no PAUSED run for {incident} within {timeout} s")


def timeline(server: PrefectServer, incident: str, fired: datetime) -> dict[str, Any]:
    """Where the alert-to-pause time went: run created (trigger), running (runner and process
    start), then each task's wall time inside the run, until PAUSED."""
    [run] = runs_of(server, incident)
    states = httpx.get(f"{server.api_url}/flow_run_states/", params={"flow_run_id": run["id"]}, timeout=10).json()
    at = {s["type"]: datetime.fromisoformat(s["timestamp"]) for s in states}
    tasks = httpx.post(f"{server.api_url}/task_runs/filter", timeout=10,
                       json={"flow_runs": {"id": {"any_": [run["id"]]}}, "limit": 200}).json()
    spent: dict[str, float] = {}
    for task in tasks:
        if task.get("start_time") and task.get("end_time"):
            name = task["name"].rsplit("-", 1)[0]
            wall = (datetime.fromisoformat(task["end_time"]) - datetime.fromisoformat(task["start_time"]))
            spent[name] = round(max(spent.get(name, 0.0), wall.total_seconds()), 2)
    created = datetime.fromisoformat(run["created"])
    return {"alert_to_created_s": round((created - fired).total_seconds(), 2),
            "created_to_running_s": round((at["RUNNING"] - created).total_seconds(), 2) if "RUNNING" in at else None,
            "running_to_paused_s": round((at["PAUSED"] - at["RUNNING"]).total_seconds(), 2)
            if {"RUNNING", "PAUSED"} <= at.keys() else None,
            "longest_task_s": dict(sorted(spent.items(), key=lambda kv: -kv[1])[:6])}


def cancel(server: PrefectServer, incident: str) -> None:
    for run in runs_of(server, incident):
        httpx.post(f"{server.api_url}/flow_runs/{run['id']}/set_state", timeout=10,
                   json={"state": {"type": "CANCELLED", "name": "Cancelled"}, "force": True})


def bench_prefix(incident: str) -> str:
    """Where the ingest service stores ``incident`` (the flow triages only that folder)."""
    return incident_prefix("bench", CLUSTER, f"job-{incident}", incident)


def alert_params(incident: str, uri: str, alert_time: datetime, world_size: int) -> dict[str, Any]:
    return {"tenant": "bench", "cluster": CLUSTER, "job_id": f"job-{incident}", "incident_id": incident,
            "alert_time": alert_time.isoformat(), "evidence": uri, "world_size": world_size,
            "reported_by_rank": 0, "alert_id": f"am-{incident}"}


def scale(args: argparse.Namespace, work: Path, endpoint: str, server: PrefectServer,
          env: dict[str, str]) -> dict[str, Any]:
    from testkit.generators.expansion import generate_dump_set
    from testkit.generators.fr_template import load_template
    from testkit.generators.hang_model import Scenario

    folder = work / f"job{args.ranks}"
    started = time.perf_counter()
    generated = generate_dump_set(folder, world_size=args.ranks, scenario=Scenario(args.scenario),
                                  template=load_template(TEMPLATE), ring_size=args.ring, workers=2)
    print(f"generated {generated.world_size} ranks in {time.perf_counter() - started:.1f} s", flush=True)
    expected = json.loads((folder / "expected.json").read_text())
    started = time.perf_counter()
    uri = upload_folder(endpoint, bench_prefix("scale-1"), folder, {"manifest.json": manifest_with_gpus(folder)})
    print(f"uploaded to {uri} in {time.perf_counter() - started:.1f} s", flush=True)
    # The CLI names the culprit's host and the evidence time; the Xid goes there, a minute before.
    cli_wall, body = run_cli(uri, env)
    print(f"denpex triage {uri}: {cli_wall:.1f} s, verdict {body['verdict']}", flush=True)
    as_of = datetime.fromisoformat(body["as_of"])
    culprit = body["candidates"][0]
    local_rank = json.loads((folder / "manifest.json").read_text())["ranks"][str(culprit["rank"])]["local_rank"]
    boto3.client("s3", endpoint_url=endpoint).put_object(
        Bucket=BUCKET, Key=f"{bench_prefix('scale-1')}/kernel.log",
        Body=xid79(culprit["host"], as_of - timedelta(minutes=1), int(local_rank)))
    cli_wall_2, body_2 = run_cli(uri, env)  # the same URI, now with the kernel log the flow also reads
    print(f"denpex triage {uri} (with kernel.log): {cli_wall_2:.1f} s", flush=True)
    flow_env = {**env, "PREFECT_LOGGING_LEVEL": "WARNING"}
    code = "import json, sys; from flows.triage import triage; triage(**json.loads(sys.argv[1]))"
    params = alert_params("scale-1", uri, as_of, args.ranks)
    started = time.perf_counter()
    fired = datetime.now(UTC)
    flow = subprocess.Popen([sys.executable, "-c", code, json.dumps(params)], cwd=REPO, env=flow_env,
                            stdout=(work / "flow.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        flow_wall = wait_paused(server, "scale-1", started, args.flow_timeout)
        flow_timeline = timeline(server, "scale-1", fired)
        print(f"flow timeline: {flow_timeline}", flush=True)
    finally:
        cancel(server, "scale-1")
        flow.terminate()
        try:
            flow.wait(timeout=30)
        except subprocess.TimeoutExpired:
            flow.kill()
    print(f"flow to PAUSED: {flow_wall:.1f} s", flush=True)
    return {"ranks": args.ranks, "ring": args.ring, "scenario": args.scenario, "uri": uri,
            "expected_culprits": expected.get("culprits"),
            "cli_verdict": body["verdict"], "cli_culprits": {str(c["rank"]): c["kind"] for c in body["candidates"]},
            "cli_s": round(cli_wall, 1), "cli_with_kernel_log_s": round(cli_wall_2, 1),
            "cli_plan": body_2["plan"], "flow_to_pause_s": round(flow_wall, 1), "flow_timeline": flow_timeline,
            "flow_over_cli": round(flow_wall / cli_wall_2, 2)}


def latency(args: argparse.Namespace, work: Path, endpoint: str, server: PrefectServer,
            env: dict[str, str]) -> list[dict[str, Any]]:
    from denpex.ingest.alert_event import AlertEvent, emit_alert

    results: list[dict[str, Any]] = []
    alert_time = datetime(2026, 11, 29, 20, 29, 50, tzinfo=UTC)
    one_second = {"PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    settings: list[tuple[str, dict[str, str], list[str]]] = [
        ("default polling", {}, []), ("1 s polling", one_second, []),
        # A fresh interpreter per run (multiprocessing spawn), which imports everything again.
        ("1 s polling, runs spawned", one_second, ["--spawn-runs"])]
    for label, extra, serve_args in settings:
        log = work / f"serve-{len(results)}.log"
        served = subprocess.Popen([sys.executable, "-m", "flows.serve", "--only", "on-alert", *serve_args], cwd=REPO,
                                  env={**env, **extra}, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        try:
            wait_for_deployments(server.api_url, ["on-alert"], served, log, 180, automations=["denpex-alert"])
            time.sleep(2)  # the runner registers the deployment, then starts polling
            times: list[float] = []
            breakdown: list[dict[str, Any]] = []
            for attempt in range(args.repeats):
                incident = f"lat-{len(results)}-{attempt}"
                uri = upload_folder(endpoint, bench_prefix(incident), GLOO, {"manifest.json": manifest_with_gpus(GLOO),
                                                               "kernel.log": xid79("gpu-node-003", alert_time - timedelta(minutes=1))})
                event = AlertEvent(**alert_params(incident, uri, alert_time, 4))
                started = time.perf_counter()
                fired = datetime.now(UTC)
                emit_alert(server.api_url, event, occurred=fired)
                times.append(wait_paused(server, incident, started, 300))
                breakdown.append(timeline(server, incident, fired))
                cancel(server, incident)
                print(f"{label}: alert to PAUSED {times[-1]:.1f} s: {breakdown[-1]}", flush=True)
            results.append({"setting": label, "alert_to_pause_s": [round(t, 1) for t in times],
                            "timeline": breakdown})
        finally:
            served.terminate()
            try:
                served.wait(timeout=30)
            except subprocess.TimeoutExpired:
                served.kill()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4096)
    parser.add_argument("--ring", type=int, default=2000)
    parser.add_argument("--scenario", default="stalled")
    parser.add_argument("--repeats", type=int, default=2, help="alert-to-pause runs per polling setting")
    parser.add_argument("--flow-timeout", type=float, default=900)
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    os.environ.update(AWS_ENV)
    work = Path(tempfile.mkdtemp(prefix="denpex-flow-scale-"))
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    host, port = moto.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    figures: dict[str, Any] = {"when": datetime.now(UTC).isoformat(timespec="seconds"),
                               "cpus": os.cpu_count(), "load_before": os.getloadavg()[0]}
    try:
        with prefect_server(work) as server:
            runbooks, state = work / "runbooks", work / "state"
            write_runbook(runbooks)
            state.mkdir()
            register_blocks(server)
            env = {**server.env(), **AWS_ENV, "DENPEX_S3_ENDPOINT_URL": endpoint,
                   "DENPEX_STATE_DIR": str(state), "DENPEX_RUNBOOKS_DIR": str(runbooks),
                   EVIDENCE_ROOT_ENV: f"s3://{BUCKET}"}
            if not args.skip_scale:
                figures["scale"] = scale(args, work, endpoint, server, env)
            if not args.skip_latency:
                figures["latency"] = latency(args, work, endpoint, server, env)
    finally:
        moto.stop()
    figures["load_after"] = os.getloadavg()[0]
    print(json.dumps(figures, indent=1))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1))
    print(f"work folder (logs, generated dumps): {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
