"""One question per incident at a time (``ApprovalBook.claim``): of runs claiming together, across
processes, exactly one holds the incident; a lapsed or ended holder is taken over; a run lets go
only of its own claim. Hostile review of issue 30: two runs started together both passed a
check-then-save, and the second saved its plan over the one being decided."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from denpex.approval_page.store import ApprovalBook


def _claim(args: tuple[str, str, float]) -> str | None:
    state, run_id, start_at = args
    book = ApprovalBook(Path(state))
    while time.time() < start_at:  # every process claims at the same moment
        time.sleep(0.001)
    return book.claim("acme", "lab", "inc-1", run_id, expires_at=time.time() + 600)


def test_of_runs_claiming_together_exactly_one_holds_the_incident(tmp_path: Path) -> None:
    ApprovalBook(tmp_path)  # the schema, before the race
    context = multiprocessing.get_context("spawn")
    with context.Pool(6) as pool:
        for round_ in range(5):
            incident_state = tmp_path / f"round-{round_}"
            ApprovalBook(incident_state)
            start_at = time.time() + 2.0
            runs = [f"run-{round_}-{n}" for n in range(6)]
            answers = pool.map(_claim, [(str(incident_state), run, start_at) for run in runs])
            winners = [run for run, holder in zip(runs, answers) if holder is None]
            assert len(winners) == 1, answers
            assert {holder for holder in answers if holder is not None} == set(winners)


def test_a_claim_is_kept_taken_over_or_let_go_as_it_should(tmp_path: Path) -> None:
    book = ApprovalBook(tmp_path)
    now = 1_000.0
    assert book.claim(None, "lab", "inc", "a", expires_at=now + 60, now=now) is None
    assert book.claim(None, "lab", "inc", "a", expires_at=now + 60, now=now) is None  # its own, again
    assert book.claim(None, "lab", "inc", "b", expires_at=now + 60, now=now) == "a"
    assert book.claim("acme", "lab", "inc", "b", expires_at=now + 60, now=now) is None  # another tenant's
    assert book.claim(None, "other", "inc", "c", expires_at=now + 60, now=now) is None  # another cluster's
    # A holder the caller found ended is taken over, and only that one.
    assert book.claim(None, "lab", "inc", "b", expires_at=now + 60, now=now, replacing="x") == "a"
    assert book.claim(None, "lab", "inc", "b", expires_at=now + 60, now=now, replacing="a") is None
    # A lapsed claim is taken over.
    assert book.claim(None, "lab", "inc", "c", expires_at=now + 200, now=now + 61) is None
    # Only the holder lets go.
    book.release(None, "lab", "inc", "b")
    assert book.claim(None, "lab", "inc", "d", expires_at=now + 200, now=now + 62) == "c"
    book.release(None, "lab", "inc", "c")
    assert book.claim(None, "lab", "inc", "d", expires_at=now + 200, now=now + 62) is None
