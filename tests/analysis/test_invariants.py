"""Issue 29, sections 4 and 5: invariants no evidence may break, checked as properties.

Over every committed real dump set (with and without an alert time) and over generated jobs
(hypothesis): never ``localized`` without a candidate, every stuck op explained by a candidate or
no ``localized``, no ``no_hang`` with an op in flight of unknown age, and an ``incomplete``
always says why. The NCCL and MoE reproductions are checked where they are triaged
(``test_nccl_scenarios.py``, ``test_moe_tangles.py``).
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from denpex.analysis.invariants import invariant_violations
from denpex.analysis.models import IncompleteReason, TriageResult, Verdict
from denpex.analysis.triage import triage_path
from dumps import T0, dump, entry, write

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FOLDERS = sorted(p.parent for family in ("gloo", "gloo_cases", "gloo_collected")
                 for p in (FIXTURES / family).glob("*/rank_*.pkl") if p.name == "rank_0.pkl")


def _pickles_only(source: Path, target: Path) -> Path:
    """The folder's pickles (and manifest, collector records); one encoding keeps it quick."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("rank_*.json", "expected.json"))
    return target


@pytest.mark.parametrize("folder", FOLDERS, ids=[f"{p.parent.name}/{p.name}" for p in FOLDERS])
def test_every_committed_dump_set_keeps_the_invariants(folder: Path, tmp_path: Path) -> None:
    """As the CLI reads it, and again as the flow does, with an alert time: a minute after the
    evidence (a real alert) and 1 s after it (an alert that came too soon, or dumps taken early)."""
    evidence = _pickles_only(folder, tmp_path / "evidence")
    plain = triage_path(evidence)
    assert invariant_violations(plain) == [], plain.model_dump_json(indent=1)
    assert plain.as_of is not None
    for after in (timedelta(minutes=1), timedelta(seconds=1)):
        alerted = triage_path(evidence, as_of=plain.as_of + after)
        assert invariant_violations(alerted) == [], alerted.model_dump_json(indent=1)
        assert alerted.verdict is not Verdict.NO_HANG or not alerted.stuck


# -- generated jobs ----------------------------------------------------------------------------------

S = 10**9


@st.composite
def _jobs(draw: st.DrawFn) -> tuple[dict[int, list[dict[str, Any]]], dict[str, Any], bool]:
    """A small NCCL-style job: a world group and tp pairs; each rank completed some ops in each
    group and holds a few in flight (asynchronous enqueue); some ranks left no dump."""
    world = draw(st.integers(2, 6))
    groups: dict[str, dict[str, Any]] = {"0": {"desc": "default_pg", "ranks": list(range(world))}}
    pairs = [list(range(r, min(r + 2, world))) for r in range(0, world, 2)]
    for i, ranks in enumerate(pairs, start=1):
        if len(ranks) == 2:
            groups[str(i)] = {"desc": "tp", "ranks": ranks}
    old = draw(st.booleans())
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for rank in range(world):
        entries: list[dict[str, Any]] = []
        record = 0
        for name, spec in groups.items():
            if rank not in spec["ranks"]:
                continue
            done, held = draw(st.integers(2, 5)), draw(st.integers(0, 3))
            for seq in range(1, done + held + 1):
                pending = seq > done
                created = T0 - (700 * S if old else S) + record * 1000
                e = entry(name, seq, retired=not pending, op="nccl:all_reduce", record_id=record,
                          state="scheduled" if pending else "completed", t=created, timeout_ms=600_000)
                if not pending:
                    e["time_discovered_completed_ns"] = created + 1000
                entries.append(e)
                record += 1
        per_rank[rank] = sorted(entries, key=lambda e: e["record_id"])
    silent = draw(st.sets(st.integers(0, world - 1), max_size=1))
    for rank in silent:
        del per_rank[rank]
    return per_rank, {"world_size": world, "process_groups": groups}, old


def _unexcused_in_flight(per_rank: dict[int, list[dict[str, Any]]]) -> bool:
    """An op in flight that no peer completed (a peer's completion proves every member entered it)."""
    done: dict[str, int] = {}
    for entries in per_rank.values():
        for e in entries:
            if e["retired"]:
                done[e["process_group"][0]] = max(done.get(e["process_group"][0], 0), e["collective_seq_id"])
    return any(not e["retired"] and e["collective_seq_id"] > done.get(e["process_group"][0], 0)
               for entries in per_rank.values() for e in entries)


def _check(result: TriageResult) -> None:
    assert invariant_violations(result) == [], result.model_dump_json(indent=1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=_jobs(), alert=st.sampled_from([None, 1, 3600]))
def test_generated_jobs_keep_the_invariants(job: tuple[dict[int, list[dict[str, Any]]], dict[str, Any], bool],
                                            alert: int | None, tmp_path_factory: pytest.TempPathFactory) -> None:
    per_rank, manifest, _ = job
    folder = write(tmp_path_factory.mktemp("job"), {r: dump(e) for r, e in per_rank.items()}, manifest=manifest)
    as_of = None if alert is None else datetime.fromtimestamp(T0 / 1e9, UTC) + timedelta(seconds=alert)
    result = triage_path(folder, as_of=as_of)
    _check(result)
    if result.verdict is Verdict.NO_HANG:
        # Without an alert time or dump times, an op in flight has no known age: never no_hang.
        assert as_of is not None or not _unexcused_in_flight(per_rank)
        assert as_of is None or not _unexcused_in_flight(per_rank), "young ops at an alert: not no_hang"


def test_a_stuck_op_whose_waits_end_on_no_rank_is_never_localized(tmp_path: Path) -> None:
    """Issue 29, section 2: no manifest, and every rank that mentions a group waits in it while
    no other rank could be a member (none idle, none shows a subgroup): the op waits on nobody the
    evidence can name. That was ``localized`` with no candidate; it is ``incomplete``."""
    world = {"pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}}
    old = T0 - 700 * S
    per_rank = {r: [entry("0", s, record_id=s, t=old + s) for s in range(1, 4)]
                + [entry("5", 1, retired=False, record_id=9, t=old + 9, timeout_ms=5000)] for r in (0, 1)}
    per_rank |= {r: [entry("0", s, record_id=s, t=old + s) for s in range(1, 4)]
                 + [entry("0", 4, retired=False, record_id=9, t=old + 9, timeout_ms=5000)] for r in (2, 3)}
    folder = write(tmp_path, {r: dump(e, **world) for r, e in per_rank.items()})
    result = triage_path(folder, world_size=4, as_of=datetime.fromtimestamp(T0 / 1e9, UTC))
    _check(result)
    assert result.verdict is not Verdict.LOCALIZED or result.candidates


def test_young_ops_at_the_alert_time_are_incomplete_not_no_hang(tmp_path: Path) -> None:
    """Issue 29, section 5 (the demo's withheld rank dated 6 s after its dumps): rank 2 never
    entered the op its peers hold, but they entered it a second before the alert. The flow said
    "NO HANG FOUND"; the dumps predate the hang, so the verdict is incomplete."""
    entries = {r: [entry("0", s, record_id=s, t=T0 - 10 * S + s) for s in range(1, 4)] for r in range(4)}
    for r in (0, 1, 3):
        entries[r].append(entry("0", 4, retired=False, record_id=4, t=T0 - S))
    folder = write(tmp_path, {r: dump(e) for r, e in entries.items()},
                   manifest={"world_size": 4, "process_groups": {"0": {"ranks": [0, 1, 2, 3]}}})
    result = triage_path(folder, as_of=datetime.fromtimestamp(T0 / 1e9, UTC))
    assert result.verdict is Verdict.INCOMPLETE and result.candidates == []
    assert result.incomplete_reason is IncompleteReason.EVIDENCE_PREDATES_ALERT
    _check(result)
    late = triage_path(folder, as_of=datetime.fromtimestamp(T0 / 1e9 + 60, UTC))
    assert late.verdict is Verdict.LOCALIZED and [c.rank for c in late.candidates] == [2]


def test_one_dump_without_a_manifest_is_a_job_of_unknown_size(tmp_path: Path) -> None:
    """Issue 29, section 5: rank 2's dump alone (the job had 4 ranks). The file name says at least
    3; the verdict says the world size is unknown, not "1 of 3 ranks reported"."""
    entries = [entry("0", s, record_id=s) for s in range(1, 4)] + [entry("0", 4, retired=False, record_id=4)]
    folder = write(tmp_path, {2: dump(entries)})
    result = triage_path(folder)
    assert result.verdict is Verdict.INCOMPLETE
    assert result.incomplete_reason is IncompleteReason.WORLD_SIZE_UNKNOWN
    assert any("world size is unknown" in n for n in result.notes)
    _check(result)
    given = triage_path(folder, world_size=4)
    assert given.incomplete_reason is not IncompleteReason.WORLD_SIZE_UNKNOWN
