"""Evidence that tells two stories must not name one culprit (issue 9 review, cases A-G).

Each case is honestly ambiguous, or names its culprit only through a rule whose premise holds.
A wrong ``localized`` can get a healthy node drained; a wrong ``no_hang`` misses a hang.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from denpex.analysis.models import CandidateKind as K
from denpex.analysis.models import TriageResult
from denpex.analysis.models import Verdict as V
from denpex.analysis.triage import triage_path
from dumps import T0, dump, entry, write

S = 10**9
OLD = T0 - 700 * S  # created 700 s before the incident; the timeout is 600 s
AS_OF = datetime.fromtimestamp(T0 / 1e9, UTC)
W4 = {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}


def nccl(pg: str, seq: int, rec: int, *, pending: bool = False, state: str | None = None,
         op: str = "nccl:all_reduce", pg_id: int = 0) -> dict[str, Any]:
    e = entry(pg, seq, op=op, record_id=rec, retired=not pending,
              state=state or ("scheduled" if pending else "completed"),
              t=OLD + rec * 1000 if pending else OLD - 100 * S + rec * 1000, timeout_ms=600_000)
    e["pg_id"] = pg_id
    return e


def started(pg: str, seq: int, rec: int) -> dict[str, Any]:
    e = nccl(pg, seq, rec, pending=True, state="started")
    e["time_discovered_started_ns"] = T0 - S
    return e


def done5(op: str = "nccl:all_reduce") -> list[dict[str, Any]]:
    return [nccl("0", s, s - 1, op=op) for s in range(1, 6)]


def triage(tmp_path: Path, per_rank: dict[int, list[dict[str, Any]]], groups: dict[str, Any],
           extra: dict[int, dict[str, Any]] | None = None, as_of: datetime | None = AS_OF) -> TriageResult:
    dumps = {r: dump(e, **(extra or {}).get(r, {})) for r, e in per_rank.items()}
    write(tmp_path, dumps, manifest={"world_size": len(per_rank), "process_groups": groups})
    return triage_path(tmp_path, as_of=as_of)


def kinds(result: TriageResult) -> dict[int, K]:
    return {c.rank: c.kind for c in result.candidates}


def nccl_config(*names: str) -> dict[str, Any]:
    return {"pg_config": {n: {"name": n, "desc": "default_pg" if n == "0" else "undefined",
                              "ranks": "[0, 1, 2, 3]"} for n in names}}


# -- B1: a rank whose CPU enqueued nothing after an all-in op -------------------------------------


def _stopped_world(stopped: set[int], **kw: Any) -> dict[int, list[dict[str, Any]]]:
    return {r: done5(**kw) + [nccl("0", 6, 5, pending=True, **kw)]
            + ([] if r in stopped else [nccl("0", 7, 6, pending=True, **kw)]) for r in range(4)}


def test_a_lone_stopped_rank_is_a_lead_never_a_localized_culprit(tmp_path: Path) -> None:
    """Case A: NCCL, timing off; rank 0 enqueued nothing after #6. A lost GPU or a hung process
    looks like this, and so does a loss.item() right after the op while a link failed: rank 0
    leads and the verdict is ambiguous (the gate drains nothing). Its peers entered the op and
    went on: nothing shows any of them behind, so they are not named (issue 17, family 1); the
    lead's reasons say whose GPU or link would hold the op instead, and what would settle it."""
    result = triage(tmp_path, _stopped_world({0}), W4)
    assert result.verdict is V.AMBIGUOUS and kinds(result) == {0: K.STALLED}
    lead = result.candidates[0]
    assert lead.confidence <= 0.35
    text = " ".join(lead.reasons)
    assert "synchronised right after the op, e.g. .item()" in text
    assert "blocked in collective #6 nccl:all_reduce Float[4] in process group '0'" in text
    assert ("if rank 0 merely synchronised after collective #6, the GPU of ranks 1, 2, 3 or a link "
            "to it holds the op instead; they are not named") in text
    assert "A hardware signal on rank 0's GPU, or NCCL timing" in text


def test_a_last_stage_that_syncs_on_the_loss_is_not_drained(tmp_path: Path) -> None:
    """Review case: a 3-rank job whose last pipeline stage (rank 2) syncs on the loss after the
    world all_reduce while a link holds it; ranks 0 and 1 went on. No localized verdict: rank 2
    is a lead, and the reasons name ranks 0 and 1 as where the op may be held instead."""
    per_rank = {r: done5() + [nccl("0", 6, 5, pending=True)] + ([] if r == 2 else [nccl("0", 7, 6, pending=True)])
                for r in range(3)}
    result = triage(tmp_path, per_rank, {"0": {"desc": "default_pg", "ranks": [0, 1, 2]}})
    assert result.verdict is V.AMBIGUOUS and [c.rank for c in result.candidates] == [2]
    assert any("the GPU of ranks 0, 1 or a link to it holds the op instead" in r
               for r in result.candidates[0].reasons)


def test_three_stopped_of_four_is_no_lead(tmp_path: Path) -> None:
    """Case A3: only rank 0 enqueued a later op (it has no sync there, the others do)."""
    result = triage(tmp_path, _stopped_world({1, 2, 3}), W4)
    assert result.verdict is V.AMBIGUOUS and kinds(result) == {r: K.STALLED for r in range(4)}


def test_half_stopped_is_no_lead(tmp_path: Path) -> None:
    result = triage(tmp_path, _stopped_world({0, 1}), W4)
    assert result.verdict is V.AMBIGUOUS and set(kinds(result)) == {0, 1, 2, 3}


def test_with_timing_on_every_kernel_started_so_no_cpu_stop_is_read(tmp_path: Path) -> None:
    """Case B: every member's kernel started: all GPUs ran it; rank 0 synced after it."""
    per_rank = {r: done5() + [started("0", 6, 5)] + ([nccl("0", 7, 6, pending=True)] if r else [])
                for r in range(4)}
    result = triage(tmp_path, per_rank, W4)
    assert result.verdict is V.AMBIGUOUS and set(kinds(result)) == {0, 1, 2, 3}
    # A plain tie is not a cycle of waits.
    assert not any("cycle" in r for c in result.candidates for r in c.reasons)
    assert all(any("none finished; the dumps cannot say whose GPU or link" in r for r in c.reasons)
               for c in result.candidates)


def test_gloo_collectives_are_synchronous_so_no_cpu_stop_is_read(tmp_path: Path) -> None:
    """Case C: on Gloo a later entry only means async_op=True; nothing about a stopped CPU."""
    world = {"pg_config": {"": {"name": "", "desc": "", "ranks": "[0, 1, 2, 3]"}}}
    result = triage(tmp_path, _stopped_world({0}, op="gloo:all_reduce"), W4,
                    extra={r: world for r in range(4)})
    assert result.verdict is V.AMBIGUOUS and set(kinds(result)) == {0, 1, 2, 3}


# -- B2: members whose rings wrapped past the group -----------------------------------------------

D_GROUPS = {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}, "1": {"ranks": [2, 3]}}


def _wrapped_tp(r: int) -> list[dict[str, Any]]:
    return [nccl("1", s, 100 + s, pg_id=1) for s in range(1, 21)]


def _assert_wrapped_is_undecided(result: TriageResult) -> None:
    assert result.verdict is V.INCOMPLETE, result.model_dump_json(indent=1)
    assert set(kinds(result)) == {2, 3}
    for candidate in result.candidates:
        text = " ".join(candidate.reasons)
        assert "or entered it and its ring has wrapped since" in text
        assert "nothing in flight" not in text
        assert candidate.confidence < 0.5


def test_members_whose_rings_wrapped_may_have_entered(tmp_path: Path) -> None:
    """Case D: ranks 2 and 3 entered world #6 (NCCL enqueues asynchronously), then ran 20 tp ops
    that completed; their rings of 20 no longer show the world group, and no pg_status says more."""
    per_rank = {0: done5() + [nccl("0", 6, 5, pending=True)], 1: done5() + [nccl("0", 6, 5, pending=True)],
                2: _wrapped_tp(2), 3: _wrapped_tp(3)}
    _assert_wrapped_is_undecided(triage(tmp_path, per_rank, D_GROUPS))


def test_pg_status_of_a_group_with_p2p_is_refused_and_leaves_it_undecided(tmp_path: Path) -> None:
    """Case D2: pg_status says ranks 2 and 3 enqueued #6, but the world group carries p2p, so its
    counters mix p2p sequence ids and are not read."""
    p2p = entry("0", 0, op="nccl:send 0->1", record_id=4, p2p_seq_id=1, is_p2p=True, retired=True,
                state="completed")
    head = [*done5()[:4], p2p, nccl("0", 5, 5), nccl("0", 6, 6, pending=True)]
    per_rank = {0: head, 1: head, 2: _wrapped_tp(2), 3: _wrapped_tp(3)}
    status = {"pg_status": {"0": {"last_enqueued_collective": 6, "last_started_collective": -1,
                                  "last_completed_collective": 5},
                            "1": {"last_enqueued_collective": 20, "last_started_collective": -1,
                                  "last_completed_collective": 20}}}
    _assert_wrapped_is_undecided(triage(tmp_path, per_rank, D_GROUPS,
                                        extra={2: {**status, **nccl_config("0", "1")},
                                               3: {**status, **nccl_config("0", "1")}}))


# -- B3: whose pg_id is it ------------------------------------------------------------------------


def _gloo(pg: str, seq: int, rec: int, pg_id: int, pending: bool = False) -> dict[str, Any]:
    e = entry(pg, seq, record_id=rec, retired=not pending, t=T0 + rec * 1_000_000)
    e["pg_id"] = pg_id
    return e


def test_gloo_pg_ids_differ_per_rank_so_only_the_default_groups_status_is_read(tmp_path: Path) -> None:
    """Case E: groups "1"=[0,1] then "2"=[1,2]. Rank 1 built both (pg_ids 1 and 2); rank 2 built
    only "2" (pg_id 1). Rank 2 waits in "2" #4; rank 1's 64-entry ring holds world entries only.
    Rank 1's pg_status[1] counts group "1", not "2": it must not read as progress in "2"."""
    groups = {"0": {"desc": "default_pg", "ranks": [0, 1, 2]}, "1": {"ranks": [0, 1]}, "2": {"ranks": [1, 2]}}
    per_rank = {
        0: [_gloo("1", s, s - 1, 1) for s in range(1, 11)] + [_gloo("0", s, 9 + s, 0) for s in range(1, 71)],
        1: [_gloo("0", s, 12 + s, 0) for s in range(7, 71)],
        2: [_gloo("2", s, s - 1, 1) for s in range(1, 4)] + [_gloo("0", s, 2 + s, 0) for s in range(1, 71)]
        + [_gloo("2", 4, 73, 1, pending=True)],
    }
    sub = {"pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}}
    status = {"pg_status": {str(i): {"last_enqueued_collective": n, "last_started_collective": -1,
                                     "last_completed_collective": n} for i, n in ((0, 70), (1, 10), (2, 3))}}
    result = triage(tmp_path, per_rank, groups, extra={0: sub, 1: {**sub, **status}, 2: sub},
                    as_of=datetime.fromtimestamp(T0 / 1e9 + 60, UTC))
    assert result.verdict is V.INCOMPLETE, result.model_dump_json(indent=1)
    assert set(kinds(result)) == {1}
    assert not any("read from pg_status" in n for n in result.notes)


def test_a_low_gloo_counter_proves_a_wrapped_rank_behind(tmp_path: Path) -> None:
    """Gloo numbers every op, sends and recvs too (tests/gloo_real/test_gloo_pg_status.py), and its
    counter is that number for the last collective: never below the collective count. Ranks 2 and
    3 read 5 in the world group (pg_id 0 everywhere) while 0 and 1 wait in #6: they never entered."""
    world = [_gloo("0", s, s - 1, 0) for s in range(1, 6)]
    waiting = world + [_gloo("0", 6, 5, 0, pending=True)]
    pair = [_gloo("1", s, 100 + s, 1) for s in range(1, 65)]
    status = {"pg_status": {"0": {"last_enqueued_collective": 5, "last_started_collective": -1,
                                  "last_completed_collective": 5}},
              "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}}
    result = triage(tmp_path, {0: waiting, 1: waiting, 2: pair, 3: pair}, D_GROUPS,
                    extra={2: status, 3: status}, as_of=datetime.fromtimestamp(T0 / 1e9 + 700, UTC))
    assert result.verdict is V.LOCALIZED, result.model_dump_json(indent=1)
    assert kinds(result) == {2: K.NOT_ENTERED, 3: K.NOT_ENTERED}
    assert any("read from pg_status" in n for n in result.notes)


def test_no_counter_is_read_after_an_in_process_restart(tmp_path: Path) -> None:
    """Review case (verified on torch 2.13): after destroy_process_group() and a second
    init_process_group() the new default group records pg_id 2, and pg_status["0"] keeps the
    destroyed group's frozen count. Ranks 2 and 3 entered #6 and wrapped; their stale 5 must not
    read as 'never enqueued it'."""
    head = [_gloo("0", s, 100 + s, 2) for s in range(1, 6)] + [_gloo("0", 6, 106, 2, pending=True)]
    pair = [_gloo("1", s, 200 + s, 3) for s in range(1, 65)]
    status = {"pg_status": {"0": {"last_enqueued_collective": 5, "last_started_collective": -1,
                                  "last_completed_collective": 5},
                            "2": {"last_enqueued_collective": 6, "last_started_collective": -1,
                                  "last_completed_collective": 5}},
              "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}}
    result = triage(tmp_path, {0: head, 1: head, 2: pair, 3: pair}, D_GROUPS, extra={2: status, 3: status},
                    as_of=datetime.fromtimestamp(T0 / 1e9 + 700, UTC))
    assert result.verdict is V.INCOMPLETE and set(kinds(result)) == {2, 3}
    assert result.stuck[0].unknown_ranks == (2, 3)
    assert not any("pg_status" in n for n in result.notes)


@pytest.mark.parametrize("fmt", ["pickle", "json"])
def test_a_restart_whose_ring_kept_the_old_groups_entries_reads_no_counter(tmp_path: Path, fmt: str) -> None:
    """Review case (torch 2.13 Gloo): destroy_process_group() leaves the ring alone, so ranks 0 and 1
    hold the old default group's #1-5 under pg_id 0, then the new one's #1-6 under pg_id 1. Ranks
    2 and 3 entered the new #6 and wrapped; their frozen pg_status["0"] of 5 is the old group's."""
    old = [_gloo("0", s, s - 1, 0) for s in range(1, 6)]
    new = [_gloo("0", s, 4 + s, 1) for s in range(1, 6)] + [_gloo("0", 6, 10, 1, pending=True)]
    pair = [_gloo("1", s, 500 + s, 2) for s in range(1, 65)]
    status = {"pg_status": {"0": {"last_enqueued_collective": "5", "last_started_collective": "-1",
                                  "last_completed_collective": "5"},
                            "1": {"last_enqueued_collective": "6", "last_started_collective": "-1",
                                  "last_completed_collective": "5"}},
              "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}}
    per_rank = {0: old + new, 1: old + new, 2: pair, 3: pair}
    dumps = {r: dump(e, **(status if r in (2, 3) else {})) for r, e in per_rank.items()}
    write(tmp_path, dumps, manifest={"world_size": 4, "process_groups": D_GROUPS}, fmt=fmt)
    result = triage_path(tmp_path, as_of=datetime.fromtimestamp(T0 / 1e9 + 700, UTC))
    assert result.verdict is V.INCOMPLETE and set(kinds(result)) == {2, 3}
    assert result.stuck[0].unknown_ranks == (2, 3)


def test_no_counter_is_read_when_the_wrapped_rank_itself_restarted(tmp_path: Path) -> None:
    """Review case: ranks 0 and 1 are fresh processes (their default group is pg_id 0 again); ranks
    2 and 3 restarted in-process: their new default group is pg_id 1, their pair pg_id 2, and
    pg_status["0"] is the first incarnation's frozen count. Their ring shows no pg_id 1, so the
    counters cannot be told apart."""
    fresh = [_gloo("0", s, s, 0) for s in range(1, 6)] + [_gloo("0", 6, 6, 0, pending=True)]
    pair = [_gloo("1", s, 500 + s, 2) for s in range(1, 65)]

    def status(old: int) -> dict[str, Any]:
        return {"pg_status": {str(pg_id): {"last_enqueued_collective": n, "last_started_collective": -1,
                                           "last_completed_collective": n - done}
                              for pg_id, n, done in ((0, old, 0), (1, 6, 1), (2, 64, 0))},
                "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}}
    result = triage(tmp_path, {0: fresh, 1: fresh, 2: pair, 3: pair}, D_GROUPS,
                    extra={2: status(5), 3: status(9)}, as_of=datetime.fromtimestamp(T0 / 1e9 + 700, UTC))
    assert result.verdict is V.INCOMPLETE and set(kinds(result)) == {2, 3}
    assert result.stuck[0].unknown_ranks == (2, 3)


def _two_incarnations(old_ops: int, new_ops: int, pending: bool) -> list[dict[str, Any]]:
    """Old default group #1..old_ops (pg_id 0), then the rebuilt one #1..new_ops (pg_id 1)."""
    old = [_gloo("0", s, s - 1, 0) for s in range(1, old_ops + 1)]
    new = [_gloo("0", s, old_ops + s - 1, 1) for s in range(1, new_ops + 1)]
    return old + new + ([_gloo("0", new_ops + 1, old_ops + new_ops, 1, pending=True)] if pending else [])


def test_a_hang_after_an_in_process_restart_is_found_in_the_newest_incarnation(tmp_path: Path) -> None:
    """Review case: the old group's completed #1-8 made the new in-flight #6 look finished. The ring
    is split at the pg_id change (issue 17, family 6): the newest incarnation is compared, and rank
    3, which completed the new #1-5 and never entered #6, is named; the older one is a note."""
    stuck, idle = _two_incarnations(8, 5, pending=True), _two_incarnations(8, 5, pending=False)
    result = triage(tmp_path, {0: stuck, 1: stuck, 2: stuck, 3: idle}, W4,
                    as_of=datetime.fromtimestamp(T0 / 1e9 + 700, UTC))
    assert result.verdict is V.LOCALIZED, result.model_dump_json(indent=1)
    assert kinds(result) == {3: K.NOT_ENTERED}
    assert [(s.process_group, s.collective_seq_id) for s in result.stuck] == [("0", 6)]
    assert any("process group '0' was destroyed and built again" in n and "pg_id 0, up to #8" in n
               for n in result.notes)


def test_a_young_op_after_an_in_process_restart_is_progress(tmp_path: Path) -> None:
    """The same rings at the new #6's own time: the newest incarnation's op is young, not hung, so
    no healthy rank is named; an alert time that finds it young says the dumps predate the hang
    (issue 29, section 5): incomplete, not no_hang."""
    stuck, idle = _two_incarnations(8, 5, pending=True), _two_incarnations(8, 5, pending=False)
    result = triage(tmp_path, {0: stuck, 1: stuck, 2: stuck, 3: idle}, W4)
    assert result.verdict is V.INCOMPLETE and result.candidates == [], result.model_dump_json(indent=1)
    assert result.incomplete_reason == "evidence_predates_alert"
    assert any("#6 is partly entered" in n for n in result.notes)


def test_an_old_incarnations_op_does_not_localize_healthy_ranks(tmp_path: Path) -> None:
    """Review case (torch 2.13 shape): rank 0's old #6 was retired by the restart; ranks 0 and 1 wait
    in the new #4, rank 2 never entered it. The old #6 once hid the new #4; with the incarnations
    told apart (issue 17, family 6) only the newest is compared: rank 2, and no healthy rank."""
    def g(seq: int, rec: int, pg_id: int, pending: bool = False) -> dict[str, Any]:
        return nccl("0", seq, rec, pending=pending, op="gloo:all_reduce", pg_id=pg_id)

    old = [g(s, s, 0) for s in range(1, 7)]
    new = [g(s, 10 + s, 1) for s in range(1, 4)]
    per_rank = {0: old + new + [g(4, 14, 1, pending=True)], 1: old[:5] + new + [g(4, 14, 1, pending=True)],
                2: old[:5] + new}
    result = triage(tmp_path, per_rank, {"0": {"desc": "default_pg", "ranks": [0, 1, 2]}})
    assert result.verdict is V.LOCALIZED, result.model_dump_json(indent=1)
    assert kinds(result) == {2: K.NOT_ENTERED}


@pytest.mark.parametrize("value", ["--3", "\u00b2", "9" * 5000, "+5", " 5", "5.0", 2**70, True, None, [5]])
def test_hostile_pg_status_values_are_skipped_not_raised(tmp_path: Path, value: Any) -> None:
    """A counter that is not a plain number of at most 19 digits is skipped: one bad dump must not
    cost the incident its verdict."""
    world = [_gloo("0", s, s - 1, 0) for s in range(1, 6)] + [_gloo("0", 6, 5, 0, pending=True)]
    pair = [_gloo("1", s, 100 + s, 1) for s in range(1, 65)]
    status = {"pg_status": {"0": {"last_enqueued_collective": value, "last_started_collective": -1,
                                  "last_completed_collective": 3},
                            str(value)[:20]: {"last_enqueued_collective": 1, "last_completed_collective": 1}},
              "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}}
    result = triage(tmp_path, {0: world, 1: world, 2: pair, 3: pair}, D_GROUPS, extra={2: status, 3: status},
                    as_of=datetime.fromtimestamp(T0 / 1e9 + 700, UTC))
    assert result.verdict is V.INCOMPLETE and set(kinds(result)) == {2, 3}


def _nccl_wrapped_past_dp(config: dict[str, Any], witness_pg_id: int) -> dict[int, list[dict[str, Any]]]:
    """NCCL, counter-named groups "1"=[0,1,2,3] (dp) and "2"=[2,3] (tp). Ranks 0, 1 wait in dp #6;
    ranks 2 and 3 never enqueued it and ran 20 tp ops since, so their rings hold tp entries only."""
    dp = [nccl("1", s, s - 1, pg_id=1) for s in range(1, 6)] + [nccl("1", 6, 5, pending=True, pg_id=1)]
    tp = [nccl("2", s, 100 + s, pg_id=witness_pg_id) for s in range(1, 21)]
    return {0: dp, 1: dp, 2: tp, 3: tp}


NCCL_GROUPS = {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}, "1": {"ranks": [0, 1, 2, 3]},
               "2": {"ranks": [2, 3]}}
DP_STATUS = {"pg_status": {"1": {"last_enqueued_collective": 5, "last_started_collective": -1,
                                 "last_completed_collective": 5}}}


@pytest.mark.parametrize("counters", [(5, 5), (6, 5), (9, 9)], ids=["below", "at", "past"])
def test_nccl_pg_status_is_never_read(tmp_path: Path, counters: tuple[int, int]) -> None:
    """NCCL's counter is the seq id of the rank's last op, a p2p one (seqP2P_) after any send or
    recv in the group: below the op it does not prove a rank behind, at or past it does not prove
    it entered. Ranks 2 and 3 stay unknown whatever their own pg_config says of the pg_id."""
    enqueued, completed = counters
    status = {"pg_status": {"1": {"last_enqueued_collective": enqueued, "last_started_collective": -1,
                                  "last_completed_collective": completed}}}
    extra = {r: {**status, **nccl_config("0", "1", "2")} for r in (2, 3)}
    result = triage(tmp_path, _nccl_wrapped_past_dp({}, 2), NCCL_GROUPS, extra=extra)
    assert result.verdict is V.INCOMPLETE and set(kinds(result)) == {2, 3}
    assert result.stuck[0].unknown_ranks == (2, 3)
    assert all(c.confidence <= 0.45 for c in result.candidates)
    assert not any("pg_status" in n for n in result.notes)


def test_a_low_nccl_counter_with_nothing_in_flight_is_no_hang(tmp_path: Path) -> None:
    """Review case: ranks 0 and 1 completed world #1-#10; ranks 2 and 3 sent to each other once on
    the default group (their counter there is that p2p seq id, 1) and then wrapped their rings."""
    world = [nccl("0", s, s - 1) for s in range(1, 11)]
    pair = [nccl("1", s, 100 + s, pg_id=1) for s in range(1, 30)]
    low = {"pg_status": {"0": {"last_enqueued_collective": 1, "last_started_collective": -1,
                               "last_completed_collective": 1}}}
    result = triage(tmp_path, {0: world, 1: world, 2: pair, 3: pair}, D_GROUPS, extra={2: low, 3: low})
    assert result.verdict is V.NO_HANG and not result.candidates


def test_members_whose_counters_say_they_entered_are_still_unknown(tmp_path: Path) -> None:
    """Review case: rank 0's newest entry is world #6; ranks 1-3 show (6, 5) in pg_status and rings
    wrapped past the world group. NCCL's counter proves nothing: rank 0 is not named localized."""
    head = done5() + [nccl("0", 6, 5, pending=True)]
    tp = [nccl("1", s, 100 + s, pg_id=1) for s in range(1, 31)]
    status = {"pg_status": {"0": {"last_enqueued_collective": 6, "last_started_collective": -1,
                                  "last_completed_collective": 5}}}
    groups = {**W4, "1": {"ranks": [1, 2, 3]}}
    result = triage(tmp_path, {0: head, 1: tp, 2: tp, 3: tp}, groups, extra={r: status for r in (1, 2, 3)})
    assert result.verdict is V.INCOMPLETE and set(kinds(result)) == {1, 2, 3}


@pytest.mark.parametrize("counters", [(6, 6), (8, 6)], ids=["at", "past"])
def test_a_high_gloo_counter_proves_nothing(tmp_path: Path, counters: tuple[int, int]) -> None:
    """Gloo counts sends and recvs too: ranks 1-3 may show 6 or more without having entered #6."""
    head = [_gloo("0", s, s - 1, 0) for s in range(1, 6)] + [_gloo("0", 6, 5, 0, pending=True)]
    tp = [_gloo("1", s, 100 + s, 1) for s in range(1, 65)]
    status = {"pg_status": {"0": {"last_enqueued_collective": counters[0], "last_started_collective": -1,
                                  "last_completed_collective": counters[1]}},
              "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}}
    groups = {**W4, "1": {"ranks": [1, 2, 3]}}
    result = triage(tmp_path, {0: head, 1: tp, 2: tp, 3: tp}, groups, extra={r: status for r in (1, 2, 3)},
                    as_of=datetime.fromtimestamp(T0 / 1e9 + 700, UTC))
    assert result.verdict is V.INCOMPLETE and set(kinds(result)) == {1, 2, 3}
    assert result.stuck[0].unknown_ranks == (1, 2, 3)


def test_a_gloo_counter_below_what_peers_completed_is_refused(tmp_path: Path) -> None:
    """Every member enqueues a collective before it completes anywhere: a count below what the
    peers completed is not this group's, and is not read."""
    head = [_gloo("0", s, s - 1, 0) for s in range(1, 6)] + [_gloo("0", 6, 5, 0, pending=True)]
    tp = [_gloo("1", s, 100 + s, 1) for s in range(1, 65)]
    status = {"pg_status": {"0": {"last_enqueued_collective": 3, "last_started_collective": -1,
                                  "last_completed_collective": 3}},
              "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}}
    result = triage(tmp_path, {0: head, 1: head, 2: tp, 3: tp}, D_GROUPS, extra={2: status, 3: status},
                    as_of=datetime.fromtimestamp(T0 / 1e9 + 700, UTC))
    assert result.verdict is V.INCOMPLETE and set(kinds(result)) == {2, 3}
    assert any("counts fewer ops" in n for n in result.notes)


# -- B4: ops queued behind the rank's own stuck op ------------------------------------------------


def test_collectives_queued_behind_a_stuck_op_do_not_break_a_tie(tmp_path: Path) -> None:
    """Case F: everyone is in world #6 (a tie). Afterwards each CPU enqueued whatever it reached:
    0, 1: "1" #3; 2: "2" #3; 3: "3" #1. "2" and "3" show 2 -> 3 -> 1 purely from enqueue order."""
    groups = {**W4, "1": {"ranks": [0, 1]}, "2": {"ranks": [2, 3]}, "3": {"ranks": [1, 3]}}

    def hist(pg: str, pg_id: int) -> list[dict[str, Any]]:
        return [nccl(pg, s, 0, pg_id=pg_id) for s in range(1, 3)]

    per_rank = {
        0: hist("1", 1) + done5() + [nccl("0", 6, 0, pending=True), nccl("1", 3, 0, pending=True, pg_id=1)],
        1: hist("1", 1) + done5() + [nccl("0", 6, 0, pending=True), nccl("1", 3, 0, pending=True, pg_id=1)],
        2: hist("2", 1) + done5() + [nccl("0", 6, 0, pending=True), nccl("2", 3, 0, pending=True, pg_id=1)],
        3: hist("2", 1) + done5() + [nccl("0", 6, 0, pending=True), nccl("3", 1, 0, pending=True, pg_id=2)],
    }
    for entries in per_rank.values():
        for i, e in enumerate(entries):
            e["record_id"] = i  # process-wide, in enqueue order
    result = triage(tmp_path, per_rank, groups)
    assert result.verdict is V.AMBIGUOUS, result.model_dump_json(indent=1)
    assert kinds(result) == {r: K.STALLED for r in range(4)}


# -- timing on: a kernel that never started -------------------------------------------------------


def test_a_kernel_that_never_started_is_read_before_wrapped_members(tmp_path: Path) -> None:
    """Case G: ranks 0, 1's kernels started in world #6, rank 2's never did though its earlier
    work completed: rank 2's GPU. Rank 3's ring wrapped past the world group."""
    tp = [nccl("1", s, 4 + s, pg_id=1) for s in range(1, 21)]
    per_rank = {0: done5() + [started("0", 6, 5)], 1: done5() + [started("0", 6, 5)],
                2: done5() + tp + [nccl("0", 6, 25, pending=True)], 3: tp}
    result = triage(tmp_path, per_rank, D_GROUPS)
    assert result.verdict is V.LOCALIZED, result.model_dump_json(indent=1)
    assert kinds(result) == {2: K.STALLED}


def test_an_op_queued_behind_one_nothing_can_read_is_still_a_hang(tmp_path: Path) -> None:
    """Rank 0 holds world #6 behind a send whose peer cannot be resolved (no blockage of its own);
    rank 1 never enqueued #6. The queued op is the only lead left: it must not read as no_hang."""
    send = entry("1", 0, op="nccl:send 0->5", record_id=5, p2p_seq_id=1, is_p2p=True, retired=False,
                 t=OLD, timeout_ms=600_000)
    per_rank = {0: done5() + [send, nccl("0", 6, 6, pending=True)], 1: done5()}
    groups = {"0": {"desc": "default_pg", "ranks": [0, 1]}, "1": {"ranks": [0, 1]}}
    result = triage(tmp_path, per_rank, groups)
    assert result.verdict is V.LOCALIZED and kinds(result) == {1: K.NOT_ENTERED}
    assert result.stuck[0].waiting_ranks == (0,)
