"""Issue 31: the demo's bundled incident comes from a job as a user would run it, and can be
recorded again. The committed folder shows the culprit where a real job stops (its checkpoint
write), under a job's paths, never the test kit's or the recording machine's; a live recording
(4 real Gloo processes of `examples/job/train.py`) triages the same way."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from denpex.analysis.triage import triage_path
from denpex.evidence.manifest import parse_manifest_bytes
from testkit.generators.bundled_incident import JOB_ID, STALLED_RANK, record

pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "examples" / "incident-xid79"
# What the old bundle showed: the culprit waiting in the test kit's own dumper call, under the
# recording checkout's absolute paths.
NOT_A_JOBS = ("testkit", "wait_dumped", "/work/", "gloo_worker", str(ROOT))


def _culprit_stack(folder: Path) -> list[str]:
    threads = json.loads((folder / "collector" / f"rank_{STALLED_RANK}.stacks.json").read_text())["threads"]
    [main] = [t for t in threads if t["name"] == "MainThread"]
    return [f"{Path(f['file']).name}:{f['function']}" for f in main["frames"]]


def _triaged_like_the_bundle(folder: Path) -> None:
    result = triage_path(folder)
    assert result.verdict.value == "localized"
    assert [(c.rank, c.kind.value) for c in result.candidates] == [(STALLED_RANK, "not_entered")]
    assert _culprit_stack(folder)[0] == "train.py:save_checkpoint"
    manifest = parse_manifest_bytes((folder / "manifest.json").read_bytes(), source="manifest.json")
    pid = manifest.ranks[STALLED_RANK].pid
    assert f"Xid (PCI:0000:3b:00): 79, pid={pid}," in (folder / "kernel.log").read_text()


def test_the_bundled_incident_shows_a_jobs_own_stack_and_paths() -> None:
    _triaged_like_the_bundle(BUNDLED)
    for path in sorted(p for p in BUNDLED.rglob("*") if p.is_file()):
        body = path.read_bytes()
        found = [s for s in NOT_A_JOBS if s.encode() in body]
        assert not found, f"{path.relative_to(ROOT)} holds {found}"
    stacks = (BUNDLED / "collector" / "rank_0.stacks.json").read_text()
    assert "/workspace/job/train.py" in stacks
    assert json.loads((BUNDLED / "manifest.json").read_text())["job_id"] == JOB_ID


def test_a_live_recording_triages_as_the_bundle(tmp_path: Path) -> None:
    out = tmp_path / "incident"
    record(out, job_root=tmp_path / "job", venv=tmp_path / "venv")
    _triaged_like_the_bundle(out)
    frames = json.loads((out / "collector" / "rank_3.stacks.json").read_text())["threads"][0]["frames"]
    assert any(f["file"] == str(tmp_path / "job" / "train.py") for f in frames), frames
    # The job's modules load through the venv link, as from a job's own environment.
    pickled = (out / f"rank_{STALLED_RANK}.pkl").read_bytes()
    assert str(tmp_path / "venv" / "lib").encode() in pickled and sys.prefix.encode() not in pickled
