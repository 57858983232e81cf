"""The comparison on small hand-built dumps: one case per rule. Real dumps are tested elsewhere."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from denpex.analysis.models import CandidateKind as K
from denpex.analysis.models import Verdict as V
from denpex.analysis.models import IncompleteReason
from denpex.analysis.triage import triage_path
from dumps import T0, dump, entry, history, write

WORLD = {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}
PAIRS = {**WORLD, "1": {"ranks": [0, 1]}, "2": {"ranks": [2, 3]}}


def _manifest(groups: dict[str, Any], **ranks: Any) -> dict[str, Any]:
    return {"world_size": 4, "process_groups": groups,
            "ranks": {str(r): {"host": f"gpu-node-00{r + 1}"} for r in range(4)} | ranks}


def world(done: int, pending: int = 0, **kw: Any) -> list[dict[str, Any]]:
    return history("0", done, pending=pending, **kw)


def sub(pg: str, done: int, pending: int = 0, **kw: Any) -> list[dict[str, Any]]:
    return history(pg, done, pending=pending, start_record=100, **kw)


CASES: dict[str, tuple[dict[int, list[dict[str, Any]]], dict[str, Any], V, dict[int, K]]] = {
    "healthy": ({r: world(5) for r in range(4)}, WORLD, V.NO_HANG, {}),
    "withheld-one": ({0: world(5, 1), 1: world(5, 1), 2: world(5), 3: world(5, 1)}, WORLD,
                     V.LOCALIZED, {2: K.NOT_ENTERED}),
    "withheld-two": ({0: world(5, 1), 1: world(5), 2: world(5), 3: world(5, 1)}, WORLD,
                     V.LOCALIZED, {1: K.NOT_ENTERED, 2: K.NOT_ENTERED}),
    "withheld-in-subgroup": (
        {0: world(3) + sub("1", 2), 1: world(3) + sub("1", 2), 2: world(3) + sub("2", 2, 1),
         3: world(3) + sub("2", 2)}, PAIRS, V.LOCALIZED, {3: K.NOT_ENTERED}),
    "mismatch-majority": (
        {r: world(5) + [entry("0", 6, retired=False, record_id=5,
                              sizes=[[8]] if r == 1 else [[4]])] for r in range(4)},
        WORLD, V.LOCALIZED, {1: K.MISMATCH}),
    "mismatch-op": (
        {r: world(5) + [entry("0", 6, retired=False, record_id=5,
                              op="gloo:broadcast" if r == 3 else "gloo:all_reduce")] for r in range(4)},
        WORLD, V.LOCALIZED, {3: K.MISMATCH}),
    "two-rank-group-disagrees": (
        {0: world(3), 1: world(3),
         2: world(3) + sub("2", 2) + [entry("2", 3, retired=False, record_id=110, dtype="Int")],
         3: world(3) + sub("2", 2) + [entry("2", 3, retired=False, record_id=110)]},
        PAIRS, V.AMBIGUOUS, {2: K.MISMATCH, 3: K.MISMATCH}),
    "missing-rank": ({0: world(5, 1), 1: world(5, 1), 3: world(5, 1)}, WORLD, V.INCOMPLETE,
                     {2: K.STOPPED_REPORTING}),
    "missing-rank-no-hang-visible": ({0: world(5), 1: world(5), 3: world(5)}, WORLD, V.INCOMPLETE,
                                     {2: K.STOPPED_REPORTING}),
    # Every member holds the op and nothing says how long (no dump time, no --as-of): a slow
    # collective and a hung one look the same, so it is a weak lead, never no_hang (issue 9).
    "all-in-of-unknown-age": ({r: world(5, 1) for r in range(4)}, WORLD, V.AMBIGUOUS,
                              {r: K.STALLED for r in range(4)}),
    "victim-blocked-in-other-group": (
        # World waits on rank 2; rank 2 waits in group "2" on rank 3, who waits on no one.
        {0: world(3, 1), 1: world(3, 1), 2: world(3) + sub("2", 2, 1), 3: world(3) + sub("2", 2)},
        PAIRS, V.LOCALIZED, {3: K.NOT_ENTERED}),
    "stalled-in-overdue-op": (
        {0: world(3, 1), 1: world(3, 1), 2: world(3) + sub("2", 2, 1, t=T0 - 60 * 10**9),
         3: world(3) + sub("2", 2, 1, t=T0 - 60 * 10**9)},
        PAIRS, V.AMBIGUOUS, {2: K.STALLED, 3: K.STALLED}),
}


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_case(tmp_path: Path, case: str, fmt: str) -> None:
    per_rank, groups, verdict, culprits = CASES[case]
    write(tmp_path, {r: dump(e) for r, e in per_rank.items()}, fmt=fmt, manifest=_manifest(groups))
    result = triage_path(tmp_path)
    assert result.verdict is verdict, result.model_dump_json(indent=1)
    assert {c.rank: c.kind for c in result.candidates} == culprits
    for c in result.candidates:
        assert c.host == f"gpu-node-00{c.rank + 1}" and c.reasons


def test_retire_race_is_not_a_hang_once_its_age_is_known(tmp_path: Path) -> None:
    """Gloo's retire race leaves a finished op unretired. A dump time that shows it younger than
    half its timeout (5 s here) makes it progress: no_hang. An alert time (``--as-of``) says an op
    timed out: young ops at that time mean the dumps predate the hang (issue 29, section 5), so
    the verdict is incomplete, never no_hang."""
    dumped = datetime.fromtimestamp(T0 / 1e9, UTC) + timedelta(seconds=1)
    ranks = {str(r): {"dumped_at": dumped.isoformat()} for r in range(4)}
    write(tmp_path, {r: dump(world(5, 1)) for r in range(4)},
          manifest={"world_size": 4, "process_groups": WORLD, "ranks": ranks})
    assert triage_path(tmp_path).verdict is V.NO_HANG
    (tmp_path / "manifest.json").unlink()
    young = triage_path(tmp_path, as_of=dumped)
    assert young.verdict is V.INCOMPLETE and young.candidates == []
    assert young.incomplete_reason is IncompleteReason.EVIDENCE_PREDATES_ALERT
    late = triage_path(tmp_path, as_of=dumped + timedelta(seconds=4))
    assert late.verdict is V.AMBIGUOUS and late.candidates[0].kind is K.STALLED


def test_unknown_age_lowers_confidence_and_asks_for_the_alert_time(tmp_path: Path) -> None:
    per_rank = {0: world(5, 1), 1: world(5, 1), 2: world(5), 3: world(5, 1)}
    write(tmp_path, {r: dump(e) for r, e in per_rank.items()}, manifest=_manifest(WORLD))
    unknown = triage_path(tmp_path)
    [candidate] = unknown.candidates
    assert unknown.verdict is V.LOCALIZED and candidate.confidence == 0.45
    assert any("--as-of" in n for n in unknown.notes)
    as_of = datetime.fromtimestamp(T0 / 1e9, UTC) + timedelta(seconds=30)
    known = triage_path(tmp_path, as_of=as_of)
    assert known.candidates[0].confidence == 0.9 and not any("--as-of" in n for n in known.notes)
    # Young against the alert time: no rank is named (a slow rank, not a hang), and since an
    # alert says an op timed out, the dumps predate the hang (issue 29, section 5): incomplete.
    young = triage_path(tmp_path, as_of=as_of - timedelta(seconds=29))
    assert young.verdict is V.INCOMPLETE and not young.candidates
    assert young.incomplete_reason is IncompleteReason.EVIDENCE_PREDATES_ALERT
    assert any("still in progress" in n for n in young.notes)


def test_stale_dump_by_collector_time(tmp_path: Path) -> None:
    incident = datetime.fromtimestamp(T0 / 1e9, UTC)
    ranks = {str(r): {"dumped_at": incident.isoformat()} for r in range(4)}
    ranks["1"] = {"dumped_at": (incident - timedelta(hours=1)).isoformat()}
    write(tmp_path, {r: dump(world(5, 1) if r != 1 else world(3)) for r in range(4)},
          manifest={"world_size": 4, "process_groups": WORLD, "ranks": ranks})
    result = triage_path(tmp_path)
    assert result.verdict is V.INCOMPLETE and result.stale_ranks == [1]
    [candidate] = result.candidates
    assert candidate.rank == 1 and candidate.kind is K.STOPPED_REPORTING
    assert "60 min before the incident" in " ".join(candidate.reasons)


def test_stale_dump_by_entry_times(tmp_path: Path) -> None:
    old = T0 - 3 * 3600 * 10**9
    dumps = {r: dump(world(5, 1)) for r in (0, 2, 3)}
    dumps[1] = dump(world(3, t=old))
    write(tmp_path, dumps, manifest=_manifest(WORLD))
    result = triage_path(tmp_path)
    assert result.stale_ranks == [1] and result.verdict is V.INCOMPLETE


def test_as_of_in_the_past_keeps_old_evidence_fresh(tmp_path: Path) -> None:
    write(tmp_path, {0: dump(world(5, 1)), 1: dump(world(5))}, manifest={"world_size": 2})
    as_of = datetime.fromtimestamp(T0 / 1e9, UTC) + timedelta(days=90)
    replay = triage_path(tmp_path, as_of=as_of)
    assert replay.stale_ranks == [0, 1] and replay.verdict is V.INCOMPLETE
    assert triage_path(tmp_path).verdict is V.LOCALIZED


def test_file_names_and_order_do_not_matter(tmp_path: Path) -> None:
    per_rank, groups, verdict, culprits = CASES["mismatch-majority"]
    a = write(tmp_path / "a", {r: dump(e) for r, e in per_rank.items()}, manifest=_manifest(groups))
    b = tmp_path / "b"
    b.mkdir()
    for i, rank in enumerate([3, 1, 0, 2]):
        (b / f"{'zz' * i}host-x.trace.{rank:03d}.pkl").write_bytes((a / f"rank_{rank}.pkl").read_bytes())
    (b / "manifest.json").write_bytes((a / "manifest.json").read_bytes())
    assert triage_path(a).model_dump(exclude={"skipped_files", "candidates"}) == \
        triage_path(b).model_dump(exclude={"skipped_files", "candidates"})
    assert [c.rank for c in triage_path(b).candidates] == [1]
