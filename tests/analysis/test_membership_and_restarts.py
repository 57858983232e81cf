"""Issue 17, families 4 and 6, on the committed real Gloo dumps (tests/fixtures/gloo_cases/).

Family 4, ``pairs_on_demand``: a healthy job with pairs [0, 1] and [2, 3], dumped on demand while
ranks 2, 3 still had their last all_reduce in flight, no manifest. Only ranks 2, 3 mention their
pair, so it looks as if it had unseen members, and Gloo's pg_config shows that ranks 0, 1 built
*a* subgroup: a guess, never a fact.

Family 6, ``restart_withheld``: the default group ran #1-8, was destroyed and built again in the
same processes; in the new incarnation ranks 0, 2, 3 wait in all_reduce #4 and rank 1 never calls it.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

from typer.testing import CliRunner

from denpex.analysis.models import CandidateKind as K
from denpex.analysis.models import Membership
from denpex.analysis.models import Verdict as V
from denpex.analysis.triage import triage_path
from denpex.cli import app
from denpex.evidence.safe_pickle import safe_loads

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "gloo_cases"
runner = CliRunner()


def test_a_guessed_membership_names_only_low_confidence_suspects() -> None:
    """On e6a212e: incomplete, rank 0 not_entered in pair '2' at 0.225 "Gloo's pg_config shows
    that ranks 0, 1 built a subgroup", with no word that the membership is a guess."""
    result = triage_path(CASES / "pairs_on_demand")
    assert result.verdict is V.INCOMPLETE
    assert {c.rank: (c.kind, c.process_group) for c in result.candidates} == {0: (K.NOT_ENTERED, "2"),
                                                                             1: (K.NOT_ENTERED, "2")}
    for candidate in result.candidates:
        assert candidate.membership is Membership.INFERRED
        assert candidate.confidence <= 0.15
        assert "is a guess, not a fact" in candidate.reasons[-1]


def test_the_contract_and_the_text_report_say_the_membership_is_a_guess() -> None:
    as_json = runner.invoke(app, ["triage", str(CASES / "pairs_on_demand"), "--format", "json"])
    body = json.loads(as_json.stdout)
    assert {c["rank"]: c["membership"] for c in body["candidates"]} == {0: "inferred", 1: "inferred"}
    as_text = runner.invoke(app, ["triage", str(CASES / "pairs_on_demand")])
    assert as_text.stdout.count("membership of the group is a guess") == 2


def test_a_rank_proven_in_the_group_keeps_a_known_membership() -> None:
    """subgroup_unknown: rank 1 is named in the world group, whose members are known; the
    inferred pair's guess does not weaken it."""
    result = triage_path(CASES / "subgroup_unknown")
    assert [(c.rank, c.membership) for c in result.candidates] == [(1, Membership.KNOWN)]


def test_the_newest_incarnation_is_triaged() -> None:
    """On e6a212e: incomplete, no candidate, no stuck op (the old #8 hid the new #4)."""
    result = triage_path(CASES / "restart_withheld")
    assert result.verdict is V.LOCALIZED
    assert {c.rank: c.kind for c in result.candidates} == {1: K.NOT_ENTERED}
    assert [(s.process_group, s.collective_seq_id, s.waiting_ranks) for s in result.stuck] == [("0", 4, (0, 2, 3))]
    older = [n for n in result.notes if "destroyed and built again" in n]
    assert len(older) == 1 and "pg_id 0, up to #8" in older[0] and "(pg_id 1)" in older[0]


def test_a_rank_that_holds_only_the_old_incarnation_has_nothing_in_the_new(tmp_path: Path) -> None:
    """Rank 1's ring cut back to the first incarnation (its dump taken before the restart, or the
    ring dropping the rest): every entry predates the others' restart, so it has enqueued nothing
    in the newest one, and its old #8 does not count there."""
    for pkl in CASES.joinpath("restart_withheld").glob("rank_*.pkl"):
        shutil.copyfile(pkl, tmp_path / pkl.name)
    body = safe_loads((tmp_path / "rank_1.pkl").read_bytes())
    assert isinstance(body, dict)
    body["entries"] = [e for e in body["entries"] if e["pg_id"] == 0]
    (tmp_path / "rank_1.pkl").write_bytes(pickle.dumps(body, protocol=2))
    result = triage_path(tmp_path)
    assert [(s.process_group, s.collective_seq_id) for s in result.stuck] == [("0", 4)]
    assert 1 in [c.rank for c in result.candidates]
    assert any("rank 1 hold only entries from before every other rank's restart" in n for n in result.notes)
