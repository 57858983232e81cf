"""An incident folder as `make demo DEMO=folder` takes it: checked before anything starts, then
sent through a running ingest service as the job's collectors and node agents would send it.

    incident = check_incident(folder)              # one clear line (SystemExit) when unusable
    send_incident(incident, url, registry, "s3://evidence", "inc-1", say=print)

The demo (``scripts/demo.py``) starts the services and calls both; the folder tests call them
against the suite's shared flow rig, so that what a folder's names, manifest and telemetry do to
the incident is checked without starting a whole demo for each folder.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from denpex.ingest.registry import Registry

__all__ = ["IncidentFolder", "check_incident", "lab_size", "send_incident", "wait_for_manifest"]

Say = Callable[[str], None]


@dataclass(frozen=True)
class IncidentFolder:
    """An incident folder checked before anything starts: its dumps found by the core's rule
    (``denpex.evidence.discovery``: the manifest's ``dump_file``, else the name's trailing number,
    so torch's ``comm_lib_trace_rank_3`` as well as ``rank_3.pkl``), its telemetry by the flow's
    (``denpex.workflow.telemetry_files``), and when the watchdog alerted."""

    folder: Path
    manifest: dict[str, Any]
    dumps: dict[int, Path]
    telemetry: list[Path]
    alert_time: datetime
    alert_basis: str = ""
    """Why the alert is dated so (printed beside the time)."""


def check_incident(folder: Path) -> IncidentFolder:
    """Read the folder as triage would; one clear line (SystemExit) when it cannot be demonstrated.

    The alert is dated as the watchdog would have raised it: with the manifest's dump times, a few
    seconds after the newest; without them, when the first op in flight reached its timeout (the
    earliest ``time_created + timeout_ms``), else a few seconds after the dumps' newest entry. An
    alert at the wall clock would find every rank of an older folder stale, and one a few seconds
    after dumps taken early in a hang would find the stuck op still young (no hang yet).
    """
    from denpex.analysis.triage import summarize_inventory, take_inventory, triage_outcomes
    from denpex.evidence.errors import EvidenceError
    from denpex.evidence.store import open_store
    from denpex.workflow.telemetry_files import telemetry_names

    def unusable(why: str) -> SystemExit:
        return SystemExit(f"demo: {folder} cannot be demonstrated: {why}")

    if not (folder / "manifest.json").is_file():
        raise unusable("no manifest.json (an incident folder holds per-rank dumps, manifest.json with the "
                       "world size and each rank's host, and optional *.log / *.jsonl telemetry)")
    store = open_store(folder)
    try:
        inventory = take_inventory(store)
        if not inventory.dumps:
            skipped = "; ".join(f"{s.path}: {s.reason}" for s in inventory.skipped[:5]) or "the folder holds none"
            raise unusable("no Flight Recorder dumps found (a dump is named by the manifest's ranks[r].dump_file "
                           f"or ends in its rank, as comm_lib_trace_rank_3 or rank_3.pkl; {skipped})")
        outcomes = summarize_inventory(store, inventory)
        evidence_time = triage_outcomes(inventory, outcomes).as_of
        telemetry = [folder / name for name in telemetry_names(store)]
    except EvidenceError as exc:
        raise unusable(str(exc)) from None
    if inventory.manifest is None or not any(i.host for i in inventory.manifest.ranks.values()):
        raise unusable("manifest.json names no rank's host; the local Slurm drains the culprit's host")
    manifest = json.loads((folder / "manifest.json").read_text())
    alert_time, basis = _alert_time(inventory.manifest, outcomes, evidence_time)
    return IncidentFolder(folder=folder, manifest=manifest,
                          dumps={r: folder / ref.name for r, ref in sorted(inventory.dumps.items())},
                          telemetry=telemetry, alert_time=alert_time, alert_basis=basis)


def _alert_time(manifest: Any, outcomes: list[Any], evidence_time: datetime | None) -> tuple[datetime, str]:
    """When the watchdog alerted, and on what ground (see ``check_incident``)."""
    newest = evidence_time or datetime.now(UTC)
    if manifest is not None and any(i.dumped_at for i in manifest.ranks.values()):
        return newest + timedelta(seconds=6), "6 s after the newest dump time in the manifest"
    deadline = _first_deadline(outcomes, newest)
    if deadline is not None:
        return (deadline, "when the first op in flight reached its timeout (time_created + timeout_ms; the "
                          "manifest has no dump times)")
    return newest + timedelta(seconds=6), "6 s after the dumps' newest entry (no op in flight has a timeout)"


# A dump is anyone's file: an op's time or timeout outside these bounds dates nothing.
_MAX_TIMEOUT = timedelta(days=1)
_MAX_BEFORE_EVIDENCE = timedelta(days=7)


def _first_deadline(outcomes: list[Any], newest: datetime) -> datetime | None:
    """The earliest ``time_created + timeout_ms`` among the ops in flight that is plausible: a
    timeout of at most a day, created within a week before the newest evidence and not after it."""
    newest_ns = int(newest.timestamp() * 1e9)
    earliest_ns = newest_ns - int(_MAX_BEFORE_EVIDENCE.total_seconds() * 1e9)
    deadlines = [op.time_created_ns + op.timeout_ms * 1_000_000
                 for summary in outcomes for group in getattr(summary, "groups", {}).values()
                 for op in group.pending
                 if op.time_created_ns and op.timeout_ms and earliest_ns <= op.time_created_ns <= newest_ns
                 and op.timeout_ms <= _MAX_TIMEOUT.total_seconds() * 1000]
    return datetime.fromtimestamp(min(deadlines) / 1e9, UTC) if deadlines else None


def lab_size(incident: IncidentFolder) -> int:
    """The local Slurm's node count; the manifest's hosts must be among its names (checked before
    anything starts)."""
    hosts = sorted({r.get("host") for r in incident.manifest.get("ranks", {}).values() if r.get("host")})
    # 16 nodes as in the tests: draining one stays inside the runbook's 10% blast radius.
    size = max(16, len(hosts))
    missing = [h for h in hosts if h not in {f"gpu-node-{i:03d}" for i in range(1, size + 1)}]
    if missing:
        raise SystemExit(f"demo: {incident.folder} cannot be demonstrated: the local Slurm names its nodes "
                         f"gpu-node-001..gpu-node-{size:03d}; the manifest's hosts {missing} are not among them")
    return size


_IDENTITY_FIELDS = ("host", "local_rank", "pid", "gpu_uuid", "gpu_pci_bus_id", "dumped_at")
_REGISTERED_FIELDS = ("host", "local_rank", "pid", "gpu_uuid", "gpu_pci_bus_id", "gpu_index")


def send_incident(incident: IncidentFolder, url: str, registry: Registry, store_uri: str, incident_id: str, *,
                  say: Say, tenant: str = "acme", cluster: str = "lab") -> str:
    """Send the folder through the ingest service at ``url`` (storing into ``store_uri``) as a job
    would: its collectors register the layout, every rank uploads its dump with a signed request
    (with its Python stacks when the folder holds them), each host's telemetry travels with that
    host's node-agent key, and Alertmanager sends the alert. ``registry`` is the service's state:
    the keys and the token are issued there. Returns the incident's evidence URI."""
    from denpex.collector.uploader import stacks_parts
    from denpex.hardware import parse_telemetry_lines
    from denpex.ingest.client import IngestClient

    def client_for(host: str | None = None) -> IngestClient:
        key = registry.create_key(tenant, cluster, host=host)
        return IngestClient(url, key_id=key.key_id, secret=key.secret, tenant=tenant, cluster=cluster)

    manifest = incident.manifest
    job_id = manifest.get("job_id") or incident.folder.name
    lines_by_host = _telemetry_by_host(incident, parse_telemetry_lines)
    job_client = client_for()
    _register_layout(job_client, job_id, manifest, say)
    ranks = manifest.get("ranks", {})
    for rank, dump in incident.dumps.items():
        ident = {k: v for k, v in ranks.get(str(rank), {}).items() if k in _IDENTITY_FIELDS}
        host = ident.get("host")
        telemetry = lines_by_host.pop(host, []) if host else []
        # A host's own telemetry travels with a key bound to that host (a node agent's): only such
        # telemetry may support a drain. One key is issued per host that has telemetry.
        client = client_for(host) if telemetry and host else job_client
        identity = {**ident, "job_id": job_id, "incident_id": incident_id, "rank": rank,
                    "world_size": manifest["world_size"], "process_groups": manifest.get("process_groups", {})}
        body = [("\n".join(telemetry) + "\n").encode()] if telemetry else []
        # The rank's Python stacks at its dump (collector/rank_<r>.stacks.json, and the py-spy
        # sidecar's), as its collector's uploader sends them: with the dump, in the same request.
        stacks = stacks_parts(incident.folder, rank)
        response = client.upload(identity, dump.read_bytes(), dump.name, body, stacks=stacks.get("stacks"),
                                 stacks_pyspy=stacks.get("stacks_pyspy"))
        if response.status_code >= 300:
            raise SystemExit(f"demo: the upload of rank {rank} was refused: {response.text}")
    for host, telemetry in sorted(lines_by_host.items()):
        if not host:
            continue
        # A host whose rank left no dump (it died): its node agent sends the kernel log alone.
        response = client_for(host).upload_telemetry({"job_id": job_id, "incident_id": incident_id},
                                                     [("\n".join(telemetry) + "\n").encode()])
        if response.status_code >= 300:
            raise SystemExit(f"demo: the telemetry of {host} was refused: {response.text}")
        say(f"{host} left no dump; its node agent sent its kernel log alone")
    incident_uri = f"{store_uri}/{tenant}/{cluster}/{job_id}/{incident_id}"
    say(f"uploaded {len(incident.dumps)} of {manifest['world_size']} ranks' dumps with signed requests to {url} "
        f"-> {incident_uri}")
    _say_stored_stacks(incident_uri, say)
    wait_for_manifest(incident_uri, set(incident.dumps))
    _send_alert(incident, url, registry, job_id, incident_id, tenant, cluster, say)
    return incident_uri


def _telemetry_by_host(incident: IncidentFolder, parse: Callable[[list[str]], Any]) -> dict[str, list[str]]:
    """The folder's telemetry lines, by the host each names ("" when a line names none)."""
    lines_by_host: dict[str, list[str]] = {}
    for path in incident.telemetry:
        for line in path.read_text(errors="replace").splitlines():
            events = parse([line]).events
            line_host = events[0].host if events and events[0].host else ""
            lines_by_host.setdefault(line_host, []).append(line)
    return lines_by_host


def _register_layout(client: Any, job_id: str, manifest: dict[str, Any], say: Say) -> None:
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
    say(f"registered job {job_id}'s layout ({len(ranks)} ranks) as its collectors would at start")


def _say_stored_stacks(incident_uri: str, say: Say) -> None:
    """Which ranks' Python stacks the service stored, read back from the store as triage reads them."""
    from denpex.evidence.stacks import read_stack_evidence
    from denpex.evidence.store import open_store

    evidence = read_stack_evidence(open_store(incident_uri), at=None)
    by_source: dict[str, list[int]] = {}
    for record in evidence.records:
        by_source.setdefault(record.source.value, []).append(record.rank)
    if by_source:
        held = "; ".join(f"{source}: ranks {', '.join(map(str, sorted(ranks)))}" for source, ranks in
                         sorted(by_source.items()))
        say(f"the service stored the ranks' Python stacks beside their dumps ({held}) in {incident_uri}/collector")
    for name, why in sorted(evidence.refused.items()):
        say(f"stacks file {name} set aside: {why}")


def wait_for_manifest(incident_uri: str, ranks: set[int], timeout_s: float = 60.0) -> None:
    """The service writes the incident's manifest.json shortly after the uploads: wait until it
    names every uploaded rank, so that the alert's run reads the whole incident."""
    from denpex.evidence.errors import EvidenceError
    from denpex.evidence.manifest import parse_manifest_bytes
    from denpex.evidence.store import open_store

    store = open_store(incident_uri)
    deadline = time.monotonic() + timeout_s
    last = "not written yet"
    while time.monotonic() < deadline:
        try:
            manifest = parse_manifest_bytes(store.read("manifest.json", max_bytes=16 << 20), source=incident_uri)
        except EvidenceError as exc:  # not written yet, or half-way: look again
            last = str(exc)
        else:
            if ranks <= set(manifest.ranks):
                return
            last = f"it names ranks {sorted(manifest.ranks)}"
        time.sleep(0.2)
    raise SystemExit(f"demo: the service wrote no manifest.json naming ranks {sorted(ranks)} in {incident_uri} "
                     f"within {timeout_s:.0f} s ({last})")


def _send_alert(incident: IncidentFolder, url: str, registry: Registry, job_id: str, incident_id: str,
                tenant: str, cluster: str, say: Say) -> None:
    """Alertmanager's webhook, with a bearer token bound to the tenant and cluster."""
    token = registry.create_token(tenant, cluster)
    alert = {"version": "4", "status": "firing", "receiver": "denpex", "alerts": [{
        "status": "firing", "startsAt": incident.alert_time.isoformat().replace("+00:00", "Z"),
        "labels": {"alertname": "NCCLWatchdogTimeout", "tenant": tenant, "cluster": cluster, "job_id": job_id,
                   "incident_id": incident_id, "rank": "0", "world_size": str(incident.manifest["world_size"])}}]}
    request = urllib.request.Request(f"{url}/v1/alerts", data=json.dumps(alert).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {token.token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 (our loopback service)
        receipt = json.loads(answer.read())
    say(f"alert through the Alertmanager webhook: {receipt['alerts'][0]}")
