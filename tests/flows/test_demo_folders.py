"""`make demo DEMO=folder` (``scripts/demo.py FOLDER``) finds the dumps by the core's rule, checks
the folder before it starts anything, and takes the alert time from the evidence.

The bundled incident's real Gloo dumps are laid out as other incidents arrive: named as torch names
them (``comm_lib_trace_rank_<r>``, no extension) or as the manifest's ``dump_file`` and trailing
numbers say, with a manifest that carries no dump times (so the evidence's own times must serve);
and the dead-rank incident, whose rank 1 left no dump. What the demo does with a folder
(``testkit.incident_folder``: check it, register the job's layout, upload each rank's dump with a
signed request, send each host's kernel log with that host's key, and the Alertmanager alert) runs
here against the suite's shared flow rig (its ingest service, served flow, S3 and Slurm lab), not in
a demo of its own: a whole demo per folder cost a minute of CPU each, and its own start, signals and
teardown are what `test_demo.py` and `test_demo_signals.py` check.
"""

from __future__ import annotations

import json
import os
import shutil
import resource
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import RigIngest
from flow_driver import FlowRig, find_run, report_of, resume, saved_plan, wait_for
from lab.rig import drained_nodes
from testkit.incident_folder import IncidentFolder, check_incident, send_incident
from testkit.services.slurm import SlurmLab

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "examples" / "incident-xid79"

# Sized to what it runs: a flow run on the shared rig per folder, up to approval and the drain.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def _demo(folder: Path, out: Path, *extra: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), str(folder), "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def _incident(tmp_path: Path, name_of: Callable[[int], str], *, dump_file: bool = False) -> Path:
    """The bundled incident with its dumps renamed and its manifest's dump times removed."""
    folder = tmp_path / "incident"
    folder.mkdir()
    manifest = json.loads((BUNDLED / "manifest.json").read_text())
    for rank, identity in manifest["ranks"].items():
        identity.pop("dumped_at")
        name = name_of(int(rank))
        shutil.copyfile(BUNDLED / f"rank_{rank}.pkl", folder / name)
        if dump_file:
            identity["dump_file"] = name
    (folder / "manifest.json").write_text(json.dumps(manifest))
    shutil.copyfile(BUNDLED / "kernel.log", folder / "kernel.log")
    return folder


@pytest.fixture
def rig_s3(flow_rig: FlowRig, monkeypatch: pytest.MonkeyPatch) -> FlowRig:
    """This process reads the rig's S3 back as the demo reads its own (the stored stacks, the manifest)."""
    monkeypatch.setenv("DENPEX_S3_ENDPOINT_URL", flow_rig.s3_endpoint)
    return flow_rig


def _through_the_rig(incident: IncidentFolder, rig: FlowRig, service: RigIngest, lab: SlurmLab,
                     approver: str) -> tuple[dict[str, Any], list[str]]:
    """What the demo does with the checked folder, against the rig; the run approved by ``approver``
    with their current TOTP code, as the demo approves it. Returns the final report and what it said."""
    said: list[str] = []
    incident_id = f"demo-{uuid.uuid4().hex[:8]}"
    send_incident(incident, service.url, service.registry, "s3://evidence/" + service.prefix, incident_id,
                  say=said.append)
    run_id = find_run(incident_id)
    assert wait_for(run_id, {"PAUSED"}) == "PAUSED"
    plan = saved_plan(rig.state_dir, incident_id)
    assert drained_nodes(lab) == set()
    resume(run_id, {"decision": "approve", "plan_hash": plan.content_hash(), "nodes": [a.node for a in plan.actions],
                    "approver": approver, "comment": "approved as the demo approves"}, state_dir=rig.state_dir)
    assert wait_for(run_id, {"COMPLETED"}) == "COMPLETED"
    return report_of(rig.state_dir, incident_id, run_id), said


@pytest.mark.parametrize(
    ("name_of", "dump_file", "nccl_timeout"),
    [
        # Issue 31 item 1: dumped early in the hang, with NCCL's 10-minute timeout on every op.
        # Dated 6 s after the newest entry, the alert found the stuck op 6 s old, still in
        # progress, and nothing was drained; the watchdog alerts when the op reaches its timeout.
        pytest.param(lambda r: f"comm_lib_trace_rank_{r}", False, True, id="torch-names-nccl-timeout"),
        # Ranks 0 and 1 only by the manifest's dump_file (no rank in the name), 2 and 3 by the
        # trailing number of a name with leading zeros.
        pytest.param(lambda r: f"{'ab'[r]}-host.fr" if r < 2 else f"dump-{r:04d}.pkl", True, False,
                     id="manifest-and-number"),
    ],
)
def test_a_folder_named_as_the_readme_allows_drains_the_culprits_node(
        rig_s3: FlowRig, lab: SlurmLab, rig_ingest: RigIngest, tmp_path: Path,
        name_of: Callable[[int], str], dump_file: bool, nccl_timeout: bool) -> None:
    folder = _incident(tmp_path, name_of, dump_file=dump_file)
    newest = _with_timeout(folder, 600_000) if nccl_timeout else None
    incident = check_incident(folder)
    assert sorted(incident.dumps) == [0, 1, 2, 3]
    # When the first op in flight reached its timeout (the demo's "alert at" line): no dump times.
    assert "reached its timeout" in incident.alert_basis
    if newest is None:
        assert incident.alert_time.isoformat().startswith("2026-12-06T02:36:45.547")
    else:
        assert incident.alert_time.timestamp() - newest > 9 * 60  # ten minutes after the stuck op began
    report, said = _through_the_rig(incident, rig_s3, rig_ingest, lab, "alice")
    assert report["outcome"] == "executed", report["reason"]
    # The alert time came from the dumps' own times: no rank of the three-day-old folder is stale.
    assert report["verdict"] == "localized" and report["stale_ranks"] == [] and report["missing_ranks"] == []
    assert [c["rank"] for c in report["candidates"]] == [2]
    assert report["plan"]["actions"] == [{"node": "gpu-node-003", "action": "drain"}]
    assert drained_nodes(lab) == {"gpu-node-003"}
    assert any(line.startswith("uploaded 4 of 4 ranks' dumps") for line in said), said


def _with_timeout(folder: Path, timeout_ms: int) -> float:
    """Give every entry of the folder's dumps ``timeout_ms``; the newest entry's creation (s)."""
    import pickle

    from denpex.evidence.safe_pickle import safe_loads

    newest = 0
    for dump in sorted(p for p in folder.iterdir() if p.name != "manifest.json" and p.suffix != ".log"):
        raw: Any = safe_loads(dump.read_bytes())
        for entry in raw["entries"]:
            entry["timeout_ms"] = timeout_ms
            newest = max(newest, entry.get("time_created_ns") or 0)
        dump.write_bytes(pickle.dumps(raw, protocol=2))
    return newest / 1e9


def test_the_dead_rank_folder_drains_its_node_from_the_registered_manifest(
        rig_s3: FlowRig, lab: SlurmLab, rig_ingest: RigIngest) -> None:
    """`make demo DEMO=examples/incident-dead-rank DEMO_APPROVE=1`: rank 1 left no dump, the kernel
    log holds an Xid 79 for its node. The folder's manifest is registered through
    `POST /v1/jobs/{job_id}/ranks` before the uploads, and the node's agent sends its kernel log
    alone: gpu-node-002 is drained."""
    folder = ROOT / "examples" / "incident-dead-rank"
    assert not (folder / "rank_1.pkl").exists() and "gpu-node-002" in (folder / "kernel.log").read_text()
    report, said = _through_the_rig(check_incident(folder), rig_s3, rig_ingest, lab, "bob")
    assert "registered job gloo-sigkill's layout (4 ranks) as its collectors would at start" in said
    assert "gpu-node-002 left no dump; its node agent sent its kernel log alone" in said
    assert report["outcome"] == "executed", report["reason"]
    assert [c["rank"] for c in report["candidates"]] == [1]
    assert report["plan"]["actions"] == [{"node": "gpu-node-002", "action": "drain"}]
    assert drained_nodes(lab) == {"gpu-node-002"}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda f: (f / "manifest.json").write_text(json.dumps({"world_size": 4})),
                     "no Flight Recorder dumps found", id="no-dumps"),
        pytest.param(lambda f: None, "no manifest.json", id="no-manifest"),
        pytest.param(lambda f: ((f / "manifest.json").write_text("{not json"),
                                shutil.copyfile(BUNDLED / "rank_0.pkl", f / "rank_0.pkl")),
                     "manifest", id="broken-manifest"),
        pytest.param(lambda f: ((f / "manifest.json").write_text(json.dumps(
            {"world_size": 1, "ranks": {"0": {"host": "login-7"}}})),
                                shutil.copyfile(BUNDLED / "rank_0.pkl", f / "rank_0.pkl")),
                     "'login-7'] are not among them", id="host-outside-the-lab"),
    ],
)
def test_an_unusable_folder_is_one_line_before_anything_starts(
        tmp_path: Path, make: Callable[[Path], object], message: str) -> None:
    folder = tmp_path / "incident"
    folder.mkdir()
    make(folder)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = _demo(folder, tmp_path / "out", timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"demo: {folder} cannot be demonstrated: ") and message in line, line
    assert not (tmp_path / "out").exists()  # no state, no server: nothing was started
    # The CPU of the demo and all it ran (a whole demo takes a minute; reading a folder, seconds):
    # the CPU, not the wall clock, which a loaded machine stretches.
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 20


def test_an_implausible_op_time_or_timeout_dates_no_alert() -> None:
    """A dump is anyone's file: an op created in 1970 or after the evidence, or a timeout of years,
    is left out of the alert's date (it would date the alert decades off, or past what a datetime
    holds); the plausible op still dates it."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from testkit.incident_folder import _first_deadline

    newest = datetime(2026, 12, 3, 2, 8, 56, tzinfo=UTC)
    ns = int(newest.timestamp() * 1e9)

    def dumps(*ops: tuple[int, int]) -> list[Any]:
        pending = [SimpleNamespace(time_created_ns=c, timeout_ms=t) for c, t in ops]
        return [SimpleNamespace(groups={"0": SimpleNamespace(pending=pending)})]

    hostile = [(1, 1_000), (ns - 5_000_000_000, 250_000_000_000_000), (ns + 10**15, 1_000)]
    assert _first_deadline(dumps(*hostile), newest) is None
    plausible = (ns - 60_000_000_000, 600_000)  # a minute before the newest entry, NCCL's 10 minutes
    assert _first_deadline(dumps(*hostile, plausible), newest) == datetime(2026, 12, 3, 2, 17, 56, tzinfo=UTC)
