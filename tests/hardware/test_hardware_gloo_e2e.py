"""End to end on real Gloo Flight Recorder dumps: triage_path + telemetry + correlate.

The scenarios under ``tests/fixtures/gloo/`` (withheld_one, sigkill, sigstop) were recorded from
real multi-process runs on one machine, so every rank ran on the same host without a GPU. Each
test gives the scenario a manifest that spreads the ranks over hosts and GPUs (one rank per host),
and a kernel log written for the case, then checks the issue's Done-when outcomes.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from denpex.analysis.models import CandidateKind, HardwareBearing, TriageResult, Verdict
from denpex.analysis.triage import triage_path
from denpex.evidence.manifest import load_manifest
from denpex.hardware import correlate, parse_telemetry_lines, supports_isolation

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gloo"
SCENARIOS = ["withheld_one", "sigkill", "sigstop"]
GPU = "0000:3b:00.0"


def prepared(scenario: str, tmp_path: Path) -> tuple[Path, TriageResult]:
    source = FIXTURES / scenario
    if not (source / "manifest.json").is_file():
        pytest.skip(f"real Gloo fixtures not generated: {source}/manifest.json is missing")
    folder = tmp_path / scenario
    shutil.copytree(source, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    for rank in range(manifest["world_size"]):
        identity = manifest.setdefault("ranks", {}).setdefault(str(rank), {})
        identity.update(host=f"gpu-node-{rank:03d}", gpu_pci_bus_id=GPU, local_rank=0)
        identity.setdefault("pid", 50_000 + rank)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder, triage_path(folder)


def culprit(result: TriageResult):
    assert result.candidates, f"triage found no candidate: {result.verdict}"
    return result.candidates[0]


def with_log(folder: Path, result: TriageResult, rank: int, msg: str) -> TriageResult:
    """Correlate ``result`` with one kernel line logged on ``rank``'s host a minute before the dumps."""
    at = (result.as_of or datetime.now(timezone.utc)) - timedelta(minutes=1)
    line = f"{at.astimezone(timezone.utc).strftime('%Y-%m-%dT%H:%M:%S')}+0000 gpu-node-{rank:03d} kernel: {msg}"
    return correlate(result, load_manifest(folder / "manifest.json"), parse_telemetry_lines([line]))


def after(correlated: TriageResult, rank: int):
    return next(c for c in correlated.candidates if c.rank == rank)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_xid79_on_the_culprit_gpu_supports_a_hardware_fault(scenario: str, tmp_path: Path) -> None:
    folder, result = prepared(scenario, tmp_path)
    rank = culprit(result).rank
    correlated = with_log(folder, result, rank, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    candidate = after(correlated, rank)
    assert [(h.code, h.bearing) for h in candidate.hardware] == [(79, HardwareBearing.SUPPORTS_HARDWARE_FAULT)]
    assert supports_isolation(candidate) and correlated.verdict is result.verdict


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_xid13_on_the_culprit_gpu_points_at_the_application(scenario: str, tmp_path: Path) -> None:
    folder, result = prepared(scenario, tmp_path)
    rank = culprit(result).rank
    candidate = after(with_log(folder, result, rank, "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception"), rank)
    assert [h.bearing for h in candidate.hardware] == [HardwareBearing.POINTS_AT_APPLICATION]
    assert not supports_isolation(candidate)


@pytest.mark.parametrize("scenario", ["sigkill", "sigstop"])
def test_oom_kill_of_the_culprit_pid_explains_its_missing_dump(scenario: str, tmp_path: Path) -> None:
    folder, result = prepared(scenario, tmp_path)
    target = culprit(result)
    assert target.kind is CandidateKind.STOPPED_REPORTING, target
    pid = load_manifest(folder / "manifest.json").ranks[target.rank].pid
    correlated = with_log(folder, result, target.rank, f"Out of memory: Killed process {pid} (python) total-vm:1kB")
    assert [h.bearing for h in after(correlated, target.rank).hardware] == [HardwareBearing.EXPLAINS_MISSING_DUMP]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_fatal_xid_on_a_non_candidate_host_is_reported_and_lowers_confidence(scenario: str, tmp_path: Path) -> None:
    folder, result = prepared(scenario, tmp_path)
    suspects = {c.rank for c in result.candidates}
    bystander = next(r for r in range(result.world_size) if r not in suspects)
    correlated = with_log(folder, result, bystander, "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
    host = f"gpu-node-{bystander:03d}"
    assert [(h.host, h.bearing) for h in correlated.other_hardware] == [(host, HardwareBearing.SUPPORTS_HARDWARE_FAULT)]
    for before, after in zip(result.candidates, correlated.candidates):
        assert after.confidence == pytest.approx(before.confidence * 0.5)
    if result.verdict is Verdict.LOCALIZED:
        assert correlated.verdict is Verdict.AMBIGUOUS
