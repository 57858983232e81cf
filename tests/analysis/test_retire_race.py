"""Issue 17, family 5: an op a peer retired is complete, but only when the evidence shows that the
peer's retire was a completion and not a timeout (Gloo retires a timed-out op too).

The dumps are the committed real Gloo ones. ``healthy_retire_race`` (world group, timeout 5 s):
rank 1 reads all_reduce #4 ``retired=False``, ranks 0, 2, 3 retired it, all created within 0.5 ms.
``withheld_one_long``: rank 0's dp all_reduce #3 timed out waiting for rank 2 (which never
entered it) and reads ``retired: True`` like a completed op. The boundary cases edit only what
the rule reads (one creation time, or the incident time) in those real dumps.
"""

from __future__ import annotations

import pickle
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from denpex.analysis.models import Verdict as V
from denpex.analysis.triage import triage_path
from denpex.evidence.safe_pickle import safe_loads

GLOO = Path(__file__).resolve().parents[1] / "fixtures" / "gloo"
CASES = Path(__file__).resolve().parents[1] / "fixtures" / "gloo_cases"
RACE = GLOO / "healthy_retire_race"
S = 10**9


def bare(source: Path, dest: Path) -> Path:
    """The pickles of a committed folder without its manifest: no dump time, no process groups."""
    dest.mkdir()
    for pkl in sorted(source.glob("rank_*.pkl")):
        shutil.copyfile(pkl, dest / pkl.name)
    return dest


def load(folder: Path, rank: int) -> dict[str, Any]:
    body = safe_loads((folder / f"rank_{rank}.pkl").read_bytes())
    assert isinstance(body, dict)
    return body


def save(folder: Path, rank: int, body: dict[str, Any]) -> None:
    (folder / f"rank_{rank}.pkl").write_bytes(pickle.dumps(body, protocol=2))


def last_world(body: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = [e for e in body["entries"] if e["process_group"][0] == "0"][-1]
    return entry


def test_the_race_is_in_the_committed_dumps() -> None:
    """What the rule reads: rank 1's #4 unretired, its peers' retired, created together."""
    ends = {r: last_world(load(RACE, r)) for r in range(4)}
    assert {r: e["retired"] for r, e in ends.items()} == {0: True, 1: False, 2: True, 3: True}
    assert {e["collective_seq_id"] for e in ends.values()} == {4}
    created = [e["time_created_ns"] for e in ends.values()]
    assert max(created) - min(created) < 5_000_000 < ends[0]["timeout_ms"] * 1_000_000


def test_a_peer_retired_op_is_complete_without_a_manifest(tmp_path: Path) -> None:
    """On e6a212e: localized, rank 1 stalled, "every member entered it and none had finished"."""
    result = triage_path(bare(RACE, tmp_path / "race"))
    assert result.verdict is V.NO_HANG, result.model_dump_json(indent=1)
    assert result.candidates == [] and result.stuck == []
    assert any("rank 1's collective #4" in n and "retire race" in n for n in result.notes)


@pytest.mark.parametrize("name", ["overlap_retire_race"])
def test_overlapping_subgroups_retire_race_is_no_hang(name: str) -> None:
    """The real family 5 job: on e6a212e, localized with rank 3 stalled in pair '3'."""
    folder = CASES / name
    unretired = [(r, e) for r in range(4) for e in load(folder, r)["entries"][-1:] if not e["retired"]]
    assert unretired, "the committed dumps must hold the race"
    result = triage_path(folder)
    assert result.verdict is V.NO_HANG, result.model_dump_json(indent=1)
    assert any("retire race" in n for n in result.notes)


def test_a_member_that_entered_after_its_peers_timeout_could_have_is_not_settled(tmp_path: Path) -> None:
    """Rank 1 entered #4 three seconds (over half the 5 s timeout) after its peers: they may have
    timed out waiting for it and retired a failed op. Not read as complete, and not localized
    on "none finished" either: the peers' retire is undecided."""
    folder = bare(RACE, tmp_path / "late")
    body = load(folder, 1)
    last_world(body)["time_created_ns"] += 3 * S
    save(folder, 1, body)
    result = triage_path(folder)
    assert result.verdict is V.INCOMPLETE, result.model_dump_json(indent=1)
    assert [c.rank for c in result.candidates] == [1]
    assert "ranks 0, 2, 3 retired it" in result.stuck[0].detail
    assert "none had finished" not in result.stuck[0].detail
    assert not any("retire race" in n for n in result.notes)


def test_an_incident_past_the_peers_timeout_does_not_settle_it(tmp_path: Path) -> None:
    """The alert came 10 s after the op, past its 5 s timeout: the peers' retire may be a timeout."""
    folder = bare(RACE, tmp_path / "late-alert")
    created = last_world(load(folder, 0))["time_created_ns"]
    result = triage_path(folder, as_of=datetime.fromtimestamp(created / 1e9 + 10, UTC))
    assert result.verdict is not V.NO_HANG and result.verdict is not V.LOCALIZED, result.model_dump_json(indent=1)
    assert not any("retire race" in n for n in result.notes)


def test_a_silent_member_keeps_the_retire_undecided(tmp_path: Path) -> None:
    """Rank 3 left no dump: it may be dead, and a dead peer fails its peers' ops before any timeout."""
    folder = bare(RACE, tmp_path / "silent")
    (folder / "rank_3.pkl").unlink()
    result = triage_path(folder, world_size=4)
    assert result.verdict is not V.NO_HANG and result.verdict is not V.LOCALIZED
    assert not any("retire race" in n for n in result.notes)


def test_a_timed_out_retire_in_the_real_dumps_keeps_its_verdict() -> None:
    """withheld_one_long: rank 0's failed dp #3 reads retired like a completed op; rank 2 never
    entered it, so nobody holds it and the rule does not apply: rank 2 stays not_entered."""
    dp = [e for e in load(GLOO / "withheld_one_long", 0)["entries"] if e["process_group"][1] == "dp"][-1]
    assert dp["retired"] is True and dp["state"] == "scheduled" and not dp.get("time_discovered_completed_ns")
    result = triage_path(GLOO / "withheld_one_long")
    assert result.verdict is V.LOCALIZED and {c.rank: c.kind.value for c in result.candidates} == {2: "not_entered"}
