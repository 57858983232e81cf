"""Issue 17, families 2 and 3: the members of one p2p batch run together, and no ``no_hang``
while an op is in flight without a known age.

A three-stage pipeline on NCCL (the dumps laid out as torch's FR pickler writes a
``batch_isend_irecv``: one ``nccl:send``/``nccl:recv`` entry per member, ``is_p2p``, the batch's
``p2p_seq_id``, never retired, then the closing ``nccl:coalesced``; testkit/generators/NCCL_FORMAT.md).
Stage 0 posts its batch ``[send to 1]``; stage 1 posts ``[recv from 0, send to 2]``; stage 2
never posts its recv. The batch on stage 1 cannot finish (NCCL runs it as one group call), so
stage 0's send waits too. Before this change the send to 2, enqueued after the recv in the same
batch, was read as queued behind rank 1's own stuck op: no edge to rank 2, and the verdict was
``no_hang`` without ``--as-of`` (``ambiguous`` between 0 and 1 with a late one).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from denpex.analysis.models import CandidateKind as K
from denpex.analysis.models import Verdict as V
from denpex.analysis.triage import triage_path
from dumps import T0, dump, entry, history, write

GROUPS = {"0": {"desc": "default_pg", "ranks": [0, 1, 2]}, "1": {"desc": "pp", "ranks": [0, 1, 2]}}
POSTED = T0 + 10_000_000
LATE = datetime.fromtimestamp((POSTED + 700 * 10**9) / 1e9, UTC)  # past the 600 s timeout


def _member(seq: int, name: str, record_id: int) -> dict[str, Any]:
    return entry("1", 0, op=name, record_id=record_id, retired=False, is_p2p=True, p2p_seq_id=seq, t=POSTED,
                 timeout_ms=600_000, sizes=[[1024]])


def _closing(seq: int, record_id: int) -> dict[str, Any]:
    return entry("1", 0, op="nccl:coalesced", record_id=record_id, retired=False, p2p_seq_id=seq, t=POSTED,
                 timeout_ms=600_000, sizes=[])


def _world() -> list[dict[str, Any]]:
    return history("0", 2, op="nccl:all_reduce", timeout_ms=600_000)


def _pipeline(tmp_path: Path, fmt: str) -> Path:
    per_rank = {
        0: _world() + [_member(1, "nccl:send 0->1", 10), _closing(1, 11)],
        1: _world() + [_member(1, "nccl:recv 1<-0", 10), _member(1, "nccl:send 1->2", 11), _closing(1, 12)],
        2: _world(),  # never posts its recv from 1
    }
    return write(tmp_path, {r: dump(e) for r, e in per_rank.items()}, fmt=fmt,
                 manifest={"world_size": 3, "process_groups": GROUPS})


@pytest.mark.parametrize("fmt", ["pickle", "json"])
@pytest.mark.parametrize("as_of", [None, LATE], ids=["no-as-of", "late-as-of"])
def test_the_rank_that_never_posted_into_a_batch_is_not_entered(tmp_path: Path, fmt: str,
                                                               as_of: datetime | None) -> None:
    result = triage_path(_pipeline(tmp_path, fmt), as_of=as_of)
    assert result.verdict is V.LOCALIZED, result.model_dump_json(indent=1)
    assert {c.rank: c.kind for c in result.candidates} == {2: K.NOT_ENTERED}
    waits = {(s.process_group, tuple(s.waiting_ranks), tuple(s.behind_ranks)) for s in result.stuck if s.is_p2p}
    assert ("1", (1,), (2,)) in waits, result.stuck  # rank 1's batch waits on rank 2


def test_ops_in_flight_of_unknown_age_are_never_no_hang(tmp_path: Path) -> None:
    """Family 3: stage 2 posted its recv too, so every send has its recv in flight and nothing
    is provably stuck; but nothing records how long they have waited: not no_hang."""
    per_rank = {
        0: _world() + [_member(1, "nccl:send 0->1", 10), _closing(1, 11)],
        1: _world() + [_member(1, "nccl:recv 1<-0", 10), _member(1, "nccl:send 1->2", 11), _closing(1, 12)],
        2: _world() + [_member(1, "nccl:recv 2<-1", 10), _closing(1, 11)],
    }
    folder = write(tmp_path, {r: dump(e) for r, e in per_rank.items()},
                   manifest={"world_size": 3, "process_groups": GROUPS})
    unknown = triage_path(folder)
    assert unknown.verdict is V.INCOMPLETE and not unknown.candidates
    assert any("nothing records how long they have waited" in n and "--as-of" in n for n in unknown.notes)
    young = triage_path(folder, as_of=datetime.fromtimestamp((POSTED + 10**9) / 1e9, UTC))
    # Young at the alert time: nobody is named, and the dumps predate the hang (issue 29, section 5).
    assert young.verdict is V.INCOMPLETE and not young.candidates, young.model_dump_json(indent=1)
    assert young.incomplete_reason == "evidence_predates_alert"
    overdue = triage_path(folder, as_of=LATE)
    assert overdue.verdict is not V.NO_HANG
