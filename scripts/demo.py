"""`make demo`: the incident workflow end to end on this machine, in the foreground.

Starts a local Prefect server on SQLite, a moto S3 server (or uses a folder) for the evidence, a
real Slurm (slurmctld + slurmd + sshd on loopback, the lab the tests use, with the manifest's hosts
as nodes), `flows/serve.py` and the ingest service (`denpex serve-api`); uploads every rank's dump
with a signed request (with its Python stacks when the folder holds them, a host's telemetry with
that host's node-agent key), sends the alert through
the Alertmanager webhook, and shows the run reaching the approval pause with its UI URL and the
report. Fresh state under out/demo/<time>/.

    make demo                      # waits for you to approve on the approval page (its URL is printed)
    make demo DEMO_APPROVE=1       # approves unattended, drains the culprit's node, exits
    make demo DEMO=path/to/folder  # another incident: per-rank dumps, manifest.json, *.log, *.jsonl,
                                   # optional collector/rank_<r>[.py-spy].stacks.json

Ctrl-C, SIGTERM or SIGHUP tear everything down. With --approve the last line is `report: PATH` (the final
report JSON); without it, once the run is done the demo prints `report: PATH` and keeps everything up
until Ctrl-C (exit 0).
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
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testkit.services.net import free_port, wait_http  # noqa: E402
from testkit.services.prefect import PrefectServer, wait_for_deployments  # noqa: E402
from testkit.incident_folder import IncidentFolder, check_incident, lab_size, send_incident  # noqa: E402
from testkit.services.process_group import signal_group  # noqa: E402


def _say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def _wait_http(url: str, what: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 90) -> None:
    try:
        wait_http(url, timeout_s, proc, log, interval_s=0.5)
    except RuntimeError as failed:
        raise SystemExit(f"demo: {what} did not come up; its log: {log}\n{failed}") from None


class Stopped(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP: unwind, tearing everything down, as Ctrl-C always did."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# The first stop signal, once received. The exit status follows it even when a library caught
# ``Stopped`` in the middle of its own work and raised an error of its own instead.
_received: list[int] = []


def _stop_on_signals() -> None:
    """Turn the first stop signal into ``Stopped`` and ignore the later ones: a second signal must
    not cut short the teardown the first one started (a service would be left running)."""

    def stop(signum: int, _frame: object) -> None:
        for each in _STOP_SIGNALS:
            signal.signal(each, signal.SIG_IGN)
        _received.append(signum)
        raise Stopped(signum)

    for each in _STOP_SIGNALS:
        signal.signal(each, stop)


class Services:
    """Every process group the demo started, stopped together: SIGTERM to all at once, one shared
    grace, then SIGKILL to any group still there. Stopping them one after another, each with its
    own grace, took minutes when one lingered; a signal's teardown must take seconds."""

    GRACE_S = 6.0

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []
        self._last: list[subprocess.Popen[bytes]] = []
        self._handles: list[IO[bytes]] = []
        self._also: list[Callable[[], None]] = []

    def spawn(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        handle = log.open("wb")
        self._handles.append(handle)
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self._procs.append(proc)
        return proc

    def adopt_last(self, proc: subprocess.Popen[bytes]) -> None:
        """A process group started elsewhere, stopped after the others: the Prefect server, which
        flows.serve and serve-api still talk to while they stop."""
        self._last.append(proc)

    def also_stop(self, stop: Callable[[], None]) -> None:
        """Something with its own stop (the Slurm lab), run beside the signals."""
        self._also.append(stop)

    def stop(self) -> None:
        others = [threading.Thread(target=stop, daemon=True) for stop in self._also]
        for thread in others:
            thread.start()
        self._stop_together(self._procs)
        self._stop_together(self._last)
        for thread in others:
            thread.join(timeout=20)
        for handle in self._handles:
            handle.close()

    def _stop_together(self, procs: list[subprocess.Popen[bytes]]) -> None:
        alive = [p for p in procs if p.poll() is None]
        for proc in alive:
            signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + self.GRACE_S
        for proc in alive:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _say(f"{_name(proc)} did not stop within {self.GRACE_S:g} s of SIGTERM; killed")
            # Its children too (a forked run, worker processes), whether or not the leader is gone.
            signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass



def _name(proc: subprocess.Popen[bytes]) -> str:
    args = proc.args if isinstance(proc.args, list) else [str(proc.args)]
    return " ".join(Path(str(a)).name if i == 0 else str(a) for i, a in enumerate(args[:4]))


def _demo_runbooks(folder: Path) -> None:
    """The shipped hang-triage runbook, with the plan-age limit widened for a recorded incident.

    The bundled dumps were recorded on 2026-12-06 (their dump times are the plan's evidence time); the
    shipped runbook refuses to act on evidence older than six hours, which is right for production
    and would refuse the demo.
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


def _start_store(services: Services, run_dir: Path, store: str, env: dict[str, str]) -> str:
    """The evidence store the ingest service writes to: moto's S3 server, or a folder."""
    if store == "folder":
        target = run_dir / "evidence"
        target.mkdir(parents=True)
        return str(target)
    port = free_port()
    moto = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
    log = run_dir / "moto.log"
    proc = services.spawn([moto, "-H", "127.0.0.1", "-p", str(port)], env, log)
    endpoint = f"http://127.0.0.1:{port}"
    _wait_http(endpoint, "moto S3 server", proc, log)
    env["DENPEX_S3_ENDPOINT_URL"] = endpoint
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="demo", aws_secret_access_key="demo")
    client.create_bucket(Bucket="evidence")
    _say(f"evidence store: moto S3 at s3://evidence ({endpoint})")
    return "s3://evidence"


def _through_the_service(services: Services, incident: IncidentFolder, run_dir: Path, store_uri: str,
                         env: dict[str, str], incident_id: str) -> None:
    """Run ``denpex serve-api``, then send the folder through it as the job's collectors and node
    agents would (``testkit.incident_folder.send_incident``), and the alert as Alertmanager would."""
    from denpex.ingest.plans import PlanTier
    from denpex.ingest.registry import Registry

    registry = Registry(Path(env["DENPEX_STATE_DIR"]))
    registry.add_tenant("acme", PlanTier.DATA_CENTER)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = run_dir / "serve-api.log"
    proc = services.spawn([sys.executable, "-m", "denpex", "serve-api", "--port", str(port), "--store", store_uri],
                          env, log)
    _wait_http(f"{url}/healthz", "denpex serve-api", proc, log)
    send_incident(incident, url, registry, store_uri, incident_id, say=_say)


def _start_slurm(services: Services, incident: IncidentFolder) -> Any:
    from testkit.services.slurm import SlurmLab

    lab = SlurmLab(Path(tempfile.mkdtemp(prefix="denpex-demo-lab-")), node_count=lab_size(incident))
    def stop_lab() -> None:
        try:
            lab.stop()
        finally:
            shutil.rmtree(lab.root, ignore_errors=True)

    # Registered before it starts: a signal during start-up stops what already runs.
    services.also_stop(stop_lab)
    lab.start()
    _say(f"slurm: slurmctld + {len(lab.nodes)} slurmd + sshd on 127.0.0.1:{lab.ssh_port} (ClusterName=lab, "
         f"in {lab.root}, removed when the demo stops)")
    return lab


def _register_blocks(lab: Any, secrets: Path) -> None:
    """The runbook and the lab's target block. The lab's SSH key goes to the workers' credentials
    folder (``secrets``, named by DENPEX_CLUSTER_SECRETS), not into the block: Prefect gives a
    block's secrets to any API client that asks."""
    from blocks import DenpexRunbook, DenpexSlurmTarget, DenpexSshCredentials
    from blocks.register import register_block_types

    register_block_types()
    DenpexRunbook(name="hang-triage").save("default", overwrite=True)
    secrets.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(secrets / "lab.ssh-key", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as key:
        key.write(lab.client_key.read_bytes())
    creds = DenpexSshCredentials(username="root", known_hosts=lab.known_hosts.read_text())
    DenpexSlurmTarget(cluster_name="lab", host="127.0.0.1", port=lab.ssh_port, credentials=creds).save(
        "lab", overwrite=True)


def _start_approval_page(services: Services, run_dir: Path, env: dict[str, str]) -> str:
    """``denpex serve-approvals``: where the paused run is decided (its own process and port). The
    flows link to it (``DENPEX_APPROVAL_PAGE_URL``) and check its signature with the public key it
    writes into the state directory."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = run_dir / "approval-page.log"
    proc = services.spawn([sys.executable, "-m", "denpex", "serve-approvals", "--port", str(port)], env, log)
    _wait_http(f"{url}/healthz", "denpex serve-approvals", proc, log)
    env["DENPEX_APPROVAL_PAGE_URL"] = url
    os.environ["DENPEX_APPROVAL_PAGE_URL"] = url
    _say(f"approval page (denpex serve-approvals): {url}")
    return url


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
    """The report artifact as text for a terminal: its inline charts written to PNG files and named
    by path (the UI renders them; a terminal would print kilobytes of base64), and the markdown's
    escapes and emphasis taken out (``all\\_reduce`` reads ``all_reduce``)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        for artifact in client.read_artifacts(limit=50):
            if artifact.key == f"denpex-{incident_id}-report":
                print(_terminal_text(_charts_to_files(str(artifact.data), run_dir / "charts")), flush=True)
                return


# CommonMark's backslash escapes (any ASCII punctuation) and the emphasis markers the report uses.
_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")
_EMPHASIS = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")


def _terminal_text(markdown: str) -> str:
    """Markdown as a terminal shows it; fenced blocks and code spans are already literal (a stack
    frame's ``__next__`` or a Windows path's backslashes stay as they are)."""
    lines, fenced = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append(line)
        elif fenced:
            lines.append(line)
        else:
            spans = line.split("`")  # odd pieces are code spans
            lines.append("`".join(p if i % 2 else _ESCAPED.sub(r"\1", _EMPHASIS.sub(r"\2", p))
                                  for i, p in enumerate(spans)))
    return "\n".join(lines)


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
    _stop_on_signals()
    # Checked before anything starts: an unusable folder is one line, not a failed run later.
    incident = check_incident(Path(args.incident).resolve())
    lab_size(incident)
    _say(f"incident {incident.folder}: dumps of ranks {', '.join(map(str, incident.dumps))} "
         f"({', '.join(p.name for p in incident.dumps.values())}); telemetry: "
         f"{', '.join(p.name for p in incident.telemetry) or 'none'}; alert at {incident.alert_time.isoformat()} "
         f"({incident.alert_basis})")
    run_dir = Path(args.out).resolve() / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir.mkdir(parents=True)
    # The Prefect server the tests use (testkit.services.prefect): SQLite in run_dir/prefect-home,
    # its output in run_dir/prefect-server.log, the UI told its API URL.
    # The API behind basic authentication, as production puts it (or behind an authenticating
    # proxy): every client (flows, the ingest service, this script) sends the auth string.
    # A first start migrates a fresh SQLite database: over 90 s on two busy cores (CI saw it).
    prefect = PrefectServer(run_dir, startup_timeout=240, auth_string=f"demo:{secrets.token_urlsafe(12)}")
    api = prefect.api_url
    env = prefect.env(PREFECT_UI_URL=prefect.url, PREFECT_LOGGING_LEVEL="WARNING",
                      DENPEX_STATE_DIR=str(run_dir / "state"), DENPEX_RUNBOOKS_DIR=str(run_dir / "runbooks"),
                      AWS_ACCESS_KEY_ID="demo", AWS_SECRET_ACCESS_KEY="demo", AWS_DEFAULT_REGION="us-east-1")
    _demo_runbooks(run_dir / "runbooks")
    code_command = _enroll_demo_operator(run_dir / "state", env)
    services = Services()
    stopped_after_the_run = False
    with ExitStack() as stack:
        _say(f"state: {run_dir}")
        stack.callback(prefect.stop)
        stack.callback(services.stop)
        try:
            prefect.start()
        except RuntimeError as failed:
            raise SystemExit(f"demo: the prefect server did not start; its log: {prefect.log}\n{failed}") from None
        if prefect.process is not None:
            services.adopt_last(prefect.process)
        _say(f"prefect server (SQLite under {prefect.home}): {prefect.url} (the UI's login asks for the API's "
             f"auth string: {prefect.auth_string})")
        store_uri = _start_store(services, run_dir, args.store, env)
        from denpex.workflow.flow_parameters import EVIDENCE_ROOT_ENV
        env[EVIDENCE_ROOT_ENV] = store_uri  # the flow triages only an incident's folder in this store
        os.environ.update(env)  # this process talks to the same API and store from here on
        lab = _start_slurm(services, incident)
        from denpex.isolation.cluster_secrets import SECRETS_ENV
        env[SECRETS_ENV] = str(run_dir / "cluster-secrets")  # the workers' own, never a block's
        _register_blocks(lab, Path(env[SECRETS_ENV]))
        page = _start_approval_page(services, run_dir, env)
        served = services.spawn([sys.executable, "-m", "flows.serve"], env, run_dir / "serve.log")
        incident_id = f"demo-{run_dir.name.lower()}"
        _wait_for_trigger(api, served, run_dir / "serve.log", headers=prefect.headers)
        _through_the_service(services, incident, run_dir, store_uri, env, incident_id)
        run_id = _find_run(incident_id)
        from testkit.services.prefect import run_url_through_login

        ui = run_url_through_login(prefect.url, run_id)  # opens in a browser not logged in yet
        state = _wait_state(run_id, {"PAUSED", "COMPLETED"})
        _show_report(incident_id, run_dir)
        if state == "PAUSED":
            decide_at = f"{page}/runs/{run_id}"
            _say(f"PAUSED for approval: the run lab/{incident_id} in the Prefect UI: {ui} (log in with the auth "
                 "string above)")
            if args.approve:
                from denpex.isolation.second_factor import TotpStore
                from testkit.services.approval_page import decide

                # On the approval page, as a person would: demo-operator, the code their authenticator shows.
                code = TotpStore(run_dir / "state").current_code("demo-operator")
                answer = decide(page, run_id, decision="approve", approver="demo-operator", code=code,
                                comment="approved by make demo")
                if answer.status_code != 303:
                    raise SystemExit(f"demo: the approval page refused the approval ({answer.status_code}): "
                                     f"{answer.text[-500:]}")
                _say(f"approved on the approval page ({decide_at}) as demo-operator with their current TOTP code "
                     "(DEMO_APPROVE=1)")
            else:
                _say(f"approve on the approval page: {decide_at}\n"
                     "  it shows the node, why, the charts and the full report; choose Approve and demo-operator, and "
                     "type the code from the authenticator app that scanned the QR code above (or the one this prints: "
                     f"{code_command}). The page signs the decision for this run and resumes it.\n"
                     "Ctrl-C stops the demo.")
            _wait_state(run_id, {"COMPLETED"}, timeout_s=None if not args.approve else 600)
        reports = sorted((run_dir / "state" / "reports").glob(f"*/*/{incident_id}-*.json"))
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
        if not args.approve:
            stopped_after_the_run = _keep_up_until_stopped(reports[-1], ui)
    if stopped_after_the_run:
        _say("stopped; everything was torn down")
        return 0
    # Printed once everything is torn down, so that it stays the last line of the output whatever
    # the teardown prints (callers, CI among them, read the report's path from the last line).
    print(f"report: {reports[-1]}", flush=True)
    # Unattended (CI) runs must end with the culprit's node drained.
    return 0 if not args.approve or final["outcome"] == "executed" else 1


def _keep_up_until_stopped(report: Path, ui: str) -> bool:
    """Interactive: the run is done; keep the UI (and the decision and report artifacts) up until
    the person stops the demo. True once stopped (Ctrl-C, SIGTERM or SIGHUP): a normal end."""
    print(f"report: {report}", flush=True)
    _say(f"the run is done; everything stays up so that you can look at it in the UI ({ui}). "
         "Ctrl-C stops the demo and tears everything down.")
    try:
        while True:
            signal.pause()
    except Stopped:
        print(flush=True)
        return True


def run(entry: Callable[[], int] = main) -> int:
    """``entry``'s exit status; when a stop signal ends it instead, 128 + the signal, once the
    teardown has run (``Stopped`` unwinds through every ``finally``), whatever error carried the
    signal out. A library may turn ``Stopped`` into its own error: pydantic's serializer did, when
    SIGHUP came during ``import prefect_aws`` at start-up. A run that stops normally on a signal
    (Ctrl-C after the run, interactive) returns its own status."""
    try:
        return entry()
    except Stopped as stopped:
        signum = stopped.signum
    except Exception as carried:
        if not _received:
            raise
        print(f"\n[demo] the stop signal reached us inside {type(carried).__name__}", flush=True)
        signum = _received[0]
    print(f"\n[demo] stopped ({signal.Signals(signum).name}); everything was torn down", flush=True)
    return 128 + signum


if __name__ == "__main__":
    sys.exit(run())
