"""Edge cases of the comparison found in review: each one once gave a wrong verdict."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from denpex.analysis.models import CandidateKind as K
from denpex.analysis.models import Verdict as V
from denpex.analysis.triage import triage_path
from dumps import T0, dump, entry, history, write

PAIRS = {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}, "1": {"ranks": [0, 1]}, "2": {"ranks": [2, 3]}}


def sub(pg: str, done: int, pending: int = 0, **kw: Any) -> list[dict[str, Any]]:
    return history(pg, done, pending=pending, start_record=100, **kw)


def triage(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]], fmt: str = "pickle",
           **manifest: Any) -> Any:
    write(tmp_path, {r: dump(e) for r, e in per_rank.items()}, fmt=fmt,
          manifest={"world_size": 4, "process_groups": PAIRS} | manifest)
    return triage_path(tmp_path)


FIRST_OP = {
    # Sequence ids start at 1: a hang in a group's very first collective has nothing completed.
    "first-world-collective": ({0: history("0", 0, pending=1), 1: history("0", 0, pending=1), 2: [],
                                3: history("0", 0, pending=1)}, {2: K.NOT_ENTERED}),
    "first-subgroup-collective": ({0: history("0", 3), 1: history("0", 3),
                                   2: history("0", 3) + sub("2", 0, 1), 3: history("0", 3)},
                                  {3: K.NOT_ENTERED}),
}
# Peers completed #4 and #5, which need every member, while rank 2's dump ends at #3: the dump
# predates the incident (issue 9, family 2). It is stale, never proof of where rank 2 stands.
TWO_BEHIND = {0: history("0", 5, pending=1), 1: history("0", 5, pending=1), 2: history("0", 3),
              3: history("0", 5, pending=1)}


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("case", list(FIRST_OP), ids=list(FIRST_OP))
def test_a_rank_behind_is_found_however_far_behind(tmp_path: Path, case: str, fmt: str) -> None:
    per_rank, culprits = FIRST_OP[case]
    result = triage(tmp_path, per_rank, fmt)
    assert result.verdict is V.LOCALIZED, result.model_dump_json(indent=1)
    assert {c.rank: c.kind for c in result.candidates} == culprits


def test_a_dump_its_peers_outran_is_stale(tmp_path: Path) -> None:
    result = triage(tmp_path, TWO_BEHIND)
    assert result.verdict is V.INCOMPLETE
    assert result.stale_ranks == [2] and result.ranks_with_evidence == [0, 1, 3]
    assert {c.rank: c.kind for c in result.candidates} == {2: K.STOPPED_REPORTING}
    assert "completed collective #5" in " ".join(result.candidates[0].reasons)
    [stuck] = result.stuck
    assert (stuck.process_group, stuck.collective_seq_id) == ("0", 6)
    assert stuck.waiting_ranks == (0, 1, 3) and stuck.behind_ranks == (2,)


HOUR_MS = 3_600_000


def _timed(seq: int, *, dumped: int | None, retired: bool, record_id: int) -> dict[str, Any]:
    """An NCCL entry with TORCH_NCCL_ENABLE_TIMING=1 and an hour-long timeout."""
    e = entry("0", seq, op="nccl:all_reduce", record_id=record_id, retired=retired,
              timeout_ms=HOUR_MS, state="completed" if retired else "started")
    e["time_discovered_started_ns"] = e["time_created_ns"] + 1000 if retired else dumped
    e["time_discovered_completed_ns"] = e["time_created_ns"] + 2000 if retired else None
    return e


def test_a_withheld_rank_is_not_stale_when_the_timeout_is_long(tmp_path: Path) -> None:
    """Timing on, a 60-minute timeout: the waiting ranks dump an hour after the hang began and
    stamp their live entries with that time. The withheld rank's newest entry is an hour older,
    as it must be; it is alive and behind, not stale."""
    dumped = T0 + HOUR_MS * 1_000_000 + 5 * 10**9
    done = [_timed(s, dumped=None, retired=True, record_id=s - 1) for s in range(1, 6)]
    waiting = done + [_timed(6, dumped=dumped, retired=False, record_id=5)]
    result = triage(tmp_path, {0: waiting, 1: waiting, 2: done, 3: waiting},
                    process_groups={"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}})
    assert result.stale_ranks == []
    assert result.verdict is V.LOCALIZED
    assert {c.rank: c.kind for c in result.candidates} == {2: K.NOT_ENTERED}


def test_an_old_dump_is_still_stale_with_a_long_timeout(tmp_path: Path) -> None:
    dumped = T0 + HOUR_MS * 1_000_000 + 5 * 10**9
    done = [_timed(s, dumped=None, retired=True, record_id=s - 1) for s in range(1, 6)]
    waiting = done + [_timed(6, dumped=dumped, retired=False, record_id=5)]
    old = [dict(e, time_created_ns=e["time_created_ns"] - 3 * HOUR_MS * 1_000_000,
                time_discovered_started_ns=None, time_discovered_completed_ns=None) for e in done[:3]]
    result = triage(tmp_path, {0: waiting, 1: waiting, 2: old, 3: waiting},
                    process_groups={"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}})
    assert result.stale_ranks == [2] and result.verdict is V.INCOMPLETE


def test_many_silent_ranks_cost_linear_time() -> None:
    """A quarter of a 131,072-rank world left no dump (hosts died, an upload failed): the world
    group and each 8-rank tp group wait on them. Scanning every blockage per culprit made this
    quadratic (over a minute); it is linear now."""
    import time

    from denpex.analysis.compare import Blockage, BlockageKind, Comparison
    from denpex.analysis.membership import GroupMembership
    from denpex.analysis.verdict import decide

    world = 131_072
    dead = set(range(0, world, 4))
    blockages = [Blockage("0", 6, BlockageKind.BEHIND, "nccl:all_reduce",
                          tuple(r for r in range(world) if r not in dead), tuple(sorted(dead)))]
    for g in range(world // 8):
        members = range(8 * g, 8 * g + 8)
        blockages.append(Blockage(f"tp{g}", 3, BlockageKind.BEHIND, "nccl:all_reduce",
                                  tuple(r for r in members if r not in dead),
                                  tuple(r for r in members if r in dead)))
    started = time.process_time()  # CPU time: a busy CI machine stretched this wall time to 25 s
    decision = decide(Comparison(blockages=blockages), {}, {r: "no usable dump" for r in dead},
                      GroupMembership(), None)
    elapsed = time.process_time() - started
    assert decision.verdict is V.INCOMPLETE and len(decision.candidates) == len(dead)
    assert all(len(c.reasons) >= 2 for c in decision.candidates[:3])
    assert elapsed < 15, f"{elapsed:.1f} s"


def test_the_text_report_of_thousands_of_stuck_ops_renders_in_linear_time() -> None:
    """A dead host in a large job stalls every group: thousands of stuck ops. Sorting them into
    direct and chained ones by list membership took minutes at 16,000."""
    import time

    from denpex.analysis.models import Candidate, StuckCollective
    from denpex.report import TriageReport, render_text

    groups = 16_000
    stuck = [StuckCollective(process_group=f"tp{g}", collective_seq_id=3, op="nccl:all_reduce",
                             waiting_ranks=(8 * g + 1, 8 * g + 2), behind_ranks=(8 * g + g % 2,))
             for g in range(groups)]
    candidates = [Candidate(rank=8 * g + 1, kind=K.NOT_ENTERED, confidence=0.9) for g in range(1, groups, 2)]
    report = TriageReport(verdict=V.LOCALIZED, world_size=8 * groups, ranks_with_evidence=[],
                          missing_ranks=[], candidates=candidates, stuck=stuck)
    started = time.process_time()
    text = render_text(report)
    assert time.process_time() - started < 5
    assert "Stuck operations waiting directly on a candidate:" in text
    assert f"and {groups - 8} more stuck ops" in text


# -- NCCL point-to-point: a matched send/recv that never finishes -------------------------

P2P_GROUPS = {"pp": {"ranks": [0, 1]}, "tpA": {"ranks": [0, 2]}, "tpB": {"ranks": [1, 3]}}
OVERDUE = T0 - 700 * 10**9  # created 700 s before the newest evidence, against a 600 s timeout


def _p2p(name: str, *, t: int, state: str = "scheduled") -> dict[str, Any]:
    return entry("pp", 0, op=name, record_id=10, p2p_seq_id=1, is_p2p=True, retired=False, t=t,
                 timeout_ms=600_000, state=state)


def _nccl(pg: str, seq: int, *, retired: bool = True) -> dict[str, Any]:
    return entry(pg, seq, op="nccl:all_reduce", record_id=seq if retired else 11, retired=retired,
                 state="completed" if retired else "scheduled", timeout_ms=600_000,
                 t=T0 if not retired else None)


def _pipeline(send: dict[str, Any], recv: dict[str, Any] | None,
              tp_waits: bool) -> dict[int, list[dict[str, Any]]]:
    done = {pg: [_nccl(pg, s) for s in range(1, 4)] for pg in ("tpA", "tpB")}
    waits = {pg: [_nccl(pg, 4, retired=False)] if tp_waits else [] for pg in ("tpA", "tpB")}
    return {0: done["tpA"] + [send], 1: done["tpB"] + ([recv] if recv else []),
            2: done["tpA"] + waits["tpA"], 3: done["tpB"] + waits["tpB"]}


P2P_CASES = {
    # Both ends posted and the transfer outlived its timeout (a link or GPU fault on either side):
    # a hang, and the dumps cannot tell the two ends apart.
    "matched-pair-overdue": (_pipeline(_p2p("nccl:send 0->1", t=OVERDUE), _p2p("nccl:recv 1<-0", t=OVERDUE),
                                       tp_waits=False), V.AMBIGUOUS, {0: K.STALLED, 1: K.STALLED}),
    "matched-pair-overdue-tp-waits": (_pipeline(_p2p("nccl:send 0->1", t=OVERDUE),
                                                _p2p("nccl:recv 1<-0", t=OVERDUE), tp_waits=True),
                                      V.AMBIGUOUS, {0: K.STALLED, 1: K.STALLED}),
    # With timing on, the end whose kernel never started is singled out.
    "matched-pair-one-kernel-started": (_pipeline(_p2p("nccl:send 0->1", t=OVERDUE, state="started"),
                                                  _p2p("nccl:recv 1<-0", t=OVERDUE), tp_waits=True),
                                        V.LOCALIZED, {1: K.STALLED}),
    # Matched ops as new as the newest evidence, with no dump time and no --as-of: how long they
    # have waited is unknown (the default incident time is their own time), so not no_hang
    # (issue 17, family 3); with a known age they are a transfer in progress (below).
    "matched-pair-young": (_pipeline(_p2p("nccl:send 0->1", t=T0), _p2p("nccl:recv 1<-0", t=T0),
                                     tp_waits=False), V.INCOMPLETE, {}),
    "recv-never-posted": (_pipeline(_p2p("nccl:send 0->1", t=OVERDUE), None, tp_waits=True),
                          V.LOCALIZED, {1: K.NOT_ENTERED}),
}


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("case", list(P2P_CASES), ids=list(P2P_CASES))
def test_p2p_pairs(tmp_path: Path, case: str, fmt: str) -> None:
    per_rank, verdict, culprits = P2P_CASES[case]
    result = triage(tmp_path, per_rank, fmt, process_groups=P2P_GROUPS)
    assert result.verdict is verdict, result.model_dump_json(indent=1)
    assert {c.rank: c.kind for c in result.candidates} == culprits


def test_young_matched_ops_of_a_known_age_are_a_transfer_in_progress(tmp_path: Path) -> None:
    per_rank = _pipeline(_p2p("nccl:send 0->1", t=T0), _p2p("nccl:recv 1<-0", t=T0), tp_waits=False)
    write(tmp_path, {r: dump(e) for r, e in per_rank.items()},
          manifest={"world_size": 4, "process_groups": PAIRS | P2P_GROUPS})
    unknown = triage_path(tmp_path)
    assert unknown.verdict is V.INCOMPLETE and not unknown.candidates
    assert any("nothing records how long they have waited" in n for n in unknown.notes), unknown.notes
    known = triage_path(tmp_path, as_of=datetime.fromtimestamp((T0 + 2 * 10**9) / 1e9, UTC))
    # A transfer in progress at the alert time: nobody is named; the alert says an op timed out,
    # so the dumps predate the hang (issue 29, section 5): incomplete, never no_hang.
    assert known.verdict is V.INCOMPLETE and not known.candidates
    assert known.incomplete_reason == "evidence_predates_alert"


def test_a_clock_far_ahead_is_pointed_out(tmp_path: Path) -> None:
    """One host's clock an hour ahead makes the others look stale (the incident time defaults to
    the newest time in the evidence). The report says so and how to override it."""
    per_rank = {r: history("0", 5, pending=0 if r == 2 else 1) for r in range(4)}
    per_rank[3] = [dict(e, time_created_ns=e["time_created_ns"] + 3600 * 10**9) for e in per_rank[3]]
    result = triage(tmp_path, per_rank, process_groups={"0": PAIRS["0"]})
    assert result.stale_ranks == [0, 1, 2]
    assert "from rank 3" in result.notes[0] and "--as-of" in result.notes[0]
    # 10 s after the ops began: past half their 5 s timeout, so a hang and not a slow step.
    rerun = triage_path(tmp_path, as_of=datetime.fromtimestamp(T0 / 1e9 + 10, UTC))
    assert rerun.verdict is V.LOCALIZED and [c.rank for c in rerun.candidates] == [2]


def test_a_batch_closer_without_its_members_is_no_collective(tmp_path: Path) -> None:
    """Issue 9, family 7 (NCCL format): rank 0 completed its batches in the pipeline group (its
    ring wrapped between the last batch's members and their nccl:coalesced closer), then hung on
    its CPU; rank 1 blocks in the next batched send to it. The closer must not read as
    'collective #0' that rank 0 waits in: rank 0 alone is the culprit, and the text says what it
    did in that p2p-only group."""
    pp = ("pp", "PIPELINE_MODEL_PARALLEL_GROUP")
    closer7 = dict(entry("pp", 0, op="nccl:coalesced", sizes=[], state="completed", p2p_seq_id=7,
                         record_id=50), process_group=pp)
    send8 = dict(entry("pp", 0, op="nccl:send 1->0", retired=False, p2p_seq_id=8, is_p2p=True,
                       record_id=60), process_group=pp)
    closer8 = dict(entry("pp", 0, op="nccl:coalesced", sizes=[], retired=False, p2p_seq_id=8,
                         record_id=61), process_group=pp)
    world = history("0", 5, op="nccl:all_reduce", start_record=40)
    write(tmp_path, {0: dump(world + [closer7]), 1: dump(world + [send8, closer8])},
          manifest={"world_size": 2, "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1]},
                                                        "pp": {"desc": pp[1], "ranks": [0, 1]}}})
    result = triage_path(tmp_path)
    assert result.verdict is V.LOCALIZED
    [candidate] = result.candidates
    assert (candidate.rank, candidate.kind) == (0, K.NOT_ENTERED)
    assert "p2p_seq_id 7" in " ".join(candidate.reasons)
    assert all("coalesced" not in s.op for s in result.stuck)


def test_rooted_ops_completed_by_some_members_do_not_make_a_dump_stale(tmp_path: Path) -> None:
    """Gloo retires gather on non-root ranks once their send is done (seen in the real
    gather_skip dumps), so ranks 1 and 2 finish two gathers that rank 3 never entered. That proves
    nothing about rank 3: it is behind, not stale."""
    def gather(seq: int, retired: bool) -> dict[str, Any]:
        return entry("0", seq, op="gloo:gather", retired=retired, record_id=seq)

    base = history("0", 3)
    per_rank = {0: base + [gather(4, False)], 1: base + [gather(4, True), gather(5, True)],
                2: base + [gather(4, True), gather(5, True)], 3: base}
    result = triage(tmp_path, per_rank, process_groups={"0": PAIRS["0"]})
    assert result.stale_ranks == [] and result.verdict is V.LOCALIZED
    assert {c.rank: c.kind for c in result.candidates} == {3: K.NOT_ENTERED}


def test_unknown_membership_names_idle_ranks_but_keeps_a_mismatch(tmp_path: Path) -> None:
    """Without a manifest, a subgroup whose every known member waits in one collective has
    members nobody can see (issue 9, family 5); a mismatch among the known members stands."""
    lone = {0: history("0", 3) + sub("1", 2, 1), 1: history("0", 3), 2: history("0", 3, pending=1),
            3: history("0", 3, pending=1)}
    write(tmp_path / "lone", {r: dump(e) for r, e in lone.items()}, manifest={"world_size": 4})
    result = triage_path(tmp_path / "lone")
    assert result.verdict is V.INCOMPLETE
    assert {c.rank: c.kind for c in result.candidates} == {1: K.NOT_ENTERED}
    [detail] = [s.detail for s in result.stuck if s.process_group == "1"]
    # One rank is "it", not "all of them" (issue 20 item 11).
    assert detail.startswith("membership is unknown: only rank 0 mentions the group, and it waits in it; "
                             "its other member can only be rank 1 (rank 1 is idle)"), detail
    clash = {0: history("0", 3) + sub("1", 2, 1), 1: history("0", 3) + sub("1", 2, 1, op="gloo:broadcast"),
             2: history("0", 3), 3: history("0", 3)}
    write(tmp_path / "clash", {r: dump(e) for r, e in clash.items()}, manifest={"world_size": 4})
    clashed = triage_path(tmp_path / "clash")
    assert {c.kind for c in clashed.candidates} == {K.MISMATCH}


def test_uneven_nccl_all_to_all_is_no_mismatch(tmp_path: Path) -> None:
    """NCCL-format (Gloo's alltoall refuses uneven lists): expert-parallel all_to_all with
    per-rank tensor lists; rank 3 never calls it. Sizes differ by design; rank 3 is the culprit."""
    def a2a(rank: int) -> dict[str, Any]:
        e = entry("0", 6, op="nccl:all_to_all", retired=False, record_id=5,
                  sizes=[[rank + j + 1, 8] for j in range(4)], dtype="BFloat16")
        return dict(e, output_sizes=[[j + rank + 1, 8] for j in range(4)])

    per_rank = {r: history("0", 5, op="nccl:all_reduce") + [a2a(r)] for r in range(3)}
    per_rank[3] = history("0", 5, op="nccl:all_reduce")
    result = triage(tmp_path, per_rank, process_groups={"0": PAIRS["0"]})
    assert result.verdict is V.LOCALIZED
    assert {c.rank: c.kind for c in result.candidates} == {3: K.NOT_ENTERED}
