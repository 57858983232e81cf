"""Bad files are reported per file with a reason, never crash the triage, never look healthy."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from denpex.analysis.models import CandidateKind, Verdict
from denpex.analysis.triage import NoUsableEvidence, TriageOptions, triage_path
from denpex.evidence.errors import DumpError, UnsafePickleError
from denpex.evidence.fr_dump import DumpEncoding, decode_dump
from denpex.evidence.safe_pickle import safe_loads
from dumps import dump, history, write

MARKER_ENV = "DENPEX_PWNED_MARKER"


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204 - a hostile payload
        return (os.system, (f"touch {self.marker}",))


def test_reduce_payload_is_refused_and_does_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"version": "2.10", "entries": [_Exploit(marker)]}, protocol=2)
    with pytest.raises(UnsafePickleError, match="posix.system"):
        safe_loads(payload)
    assert not marker.exists()


def test_hostile_dump_is_skipped_and_its_rank_counts_as_missing(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    folder = write(tmp_path / "ev", {r: dump(history("0", 5, pending=1)) for r in (0, 1, 3)})
    (folder / "rank_2.pkl").write_bytes(pickle.dumps(_Exploit(marker), protocol=2))
    result = triage_path(folder, world_size=4)
    assert not marker.exists()
    assert result.missing_ranks == [2]
    assert [s.rank for s in result.skipped_files] == [2]
    assert "refused" in result.skipped_files[0].reason
    assert result.verdict is Verdict.INCOMPLETE
    assert [(c.rank, c.kind) for c in result.candidates] == [(2, CandidateKind.STOPPED_REPORTING)]


GOOD = pickle.dumps(dump(history("0", 3)), protocol=2)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"", "empty file", id="empty"),
        pytest.param(GOOD[: len(GOOD) // 2], "not a complete pickle", id="truncated-pickle"),
        pytest.param(b'{"version": "2.10", "entries": [', "not valid JSON", id="truncated-json"),
        pytest.param(pickle.dumps([1, 2, 3], protocol=2), "top level is a list", id="wrong-type"),
        pytest.param(pickle.dumps({"entries": []}, protocol=2), "no 'version'", id="no-version"),
        pytest.param(pickle.dumps({"version": "3.0", "entries": []}, protocol=2), "not supported",
                     id="unknown-major"),
        # Issue 29: torch 2.6 writes schema 2.4, the oldest read; older ones name the torch.
        pytest.param(pickle.dumps({"version": "2.3", "entries": []}, protocol=2),
                     "schema 2.3 was written by a torch older than 2.6", id="older-than-torch-2.6"),
        pytest.param(pickle.dumps({"version": "2.10", "entries": {"a": 1}}, protocol=2),
                     "'entries' is a dict", id="entries-not-list"),
        pytest.param(b"\xff\xfe garbage", "not a pickle", id="binary-garbage"),
        pytest.param(b"[" * 100_000, "nested too deeply", id="deep-json"),
    ],
)
def test_bad_files_are_reported_with_a_reason(tmp_path: Path, data: bytes, reason: str) -> None:
    folder = write(tmp_path, {r: dump(history("0", 5)) for r in (0, 1, 2)})
    (folder / "rank_3.pkl").write_bytes(data)
    result = triage_path(folder, world_size=4)
    [skipped] = result.skipped_files
    assert skipped.rank == 3 and reason in skipped.reason
    assert 3 in result.missing_ranks and 3 not in result.ranks_with_evidence


def test_entries_without_usable_fields_are_refused() -> None:
    decoded = decode_dump(pickle.dumps(dump([{"foo": 1}, "x"]), protocol=2), source="r")
    from denpex.analysis.summary import summarize_dump

    with pytest.raises(DumpError, match="none of its 2 entries is usable"):
        summarize_dump(decoded, rank=0)


def test_oversized_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    folder = write(tmp_path, {r: dump(history("0", 5)) for r in range(3)})
    (folder / "rank_3.pkl").write_bytes(b"\x80" + b"x" * 1_000_000)
    result = triage_path(folder, world_size=4, options=TriageOptions(max_dump_bytes=100_000))
    [skipped] = result.skipped_files
    assert skipped.rank == 3 and "100000-byte cap" in skipped.reason


def test_nothing_usable_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "rank_0.pkl").write_bytes(b"junk")
    with pytest.raises(NoUsableEvidence, match="rank_0.pkl"):
        triage_path(tmp_path, world_size=2)


def test_json_and_pickle_of_one_rank_count_once(tmp_path: Path) -> None:
    body = dump(history("0", 5))
    write(tmp_path, {0: body, 1: body}, fmt="pickle")
    write(tmp_path, {0: body, 1: body}, fmt="json")
    result = triage_path(tmp_path, world_size=2)
    assert result.verdict is Verdict.NO_HANG
    assert all("same dump" in s.reason for s in result.skipped_files)


def test_two_different_files_for_one_rank_are_both_refused(tmp_path: Path) -> None:
    write(tmp_path, {0: dump(history("0", 5)), 1: dump(history("0", 5))})
    (tmp_path / "other_1.pkl").write_bytes(pickle.dumps(dump(history("0", 5)), protocol=2))
    result = triage_path(tmp_path, world_size=2)
    assert result.missing_ranks == [1]
    assert {s.path for s in result.skipped_files} == {"rank_1.pkl", "other_1.pkl"}


def test_json_dump_decodes() -> None:
    decoded = decode_dump(b'{"version": "2.10", "pg_config": {}, "pg_status": {}}', source="r0.json")
    assert decoded.encoding is DumpEncoding.JSON and decoded.version == (2, 10)


def test_mislabeled_dump_is_refused(tmp_path: Path) -> None:
    manifest = {"world_size": 4, "process_groups": {
        "0": {"ranks": [0, 1, 2, 3]}, "1": {"ranks": [0, 1]}, "2": {"ranks": [2, 3]}}}
    dumps = {r: dump(history("0", 3) + history("1" if r < 2 else "2", 2, start_record=10))
             for r in range(4)}
    dumps[3] = dumps[0]  # rank 0's dump uploaded as rank 3
    write(tmp_path, dumps, manifest=manifest)
    result = triage_path(tmp_path)
    assert result.missing_ranks == [3]
    assert "mislabeled" in result.skipped_files[0].reason


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stray", ["fr_trace_1764441902", "core.123456789012345678901234567890"])
def test_a_stray_number_in_a_file_name_does_not_make_a_giant_world(tmp_path: Path, stray: str) -> None:
    """Without a manifest the world size comes from file names: a timestamp or pid is not a rank."""
    write(tmp_path, {r: dump(history("0", 5)) for r in range(4)})
    (tmp_path / stray).write_bytes(b"not a dump")
    result = triage_path(tmp_path)
    assert result.world_size == 4 and result.verdict is Verdict.NO_HANG
    [skipped] = result.skipped_files
    assert skipped.path == stray and "too large to be a rank" in skipped.reason


def test_the_inferred_world_size_names_the_file_it_came_from(tmp_path: Path) -> None:
    write(tmp_path, {r: dump(history("0", 5)) for r in range(4)})
    (tmp_path / "notes_2025").write_bytes(b"not a dump")
    result = triage_path(tmp_path)
    assert result.world_size == 2026
    assert "notes_2025" in result.notes[0] and "--world-size" in result.notes[0]


@pytest.mark.parametrize("how", ["option", "manifest"])
def test_an_impossible_world_size_is_refused(tmp_path: Path, how: str) -> None:
    from denpex.evidence.errors import ManifestError

    write(tmp_path, {0: dump(history("0", 5))},
          manifest={"world_size": 10**12} if how == "manifest" else None)
    with pytest.raises(ManifestError, match="world.size"):
        triage_path(tmp_path, world_size=10**12 if how == "option" else None)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        pytest.param(b"", ["rank_2.pkl", "empty file", "collect"], id="empty"),
        pytest.param(GOOD[:40], ["rank_2.pkl", "truncated", "collect"], id="truncated"),
        pytest.param(pickle.dumps({"version": "3.0"}, protocol=2), ["rank_2.pkl", "schema 3.0", "Upgrade"],
                     id="newer-schema"),
    ],
)
def test_a_candidate_without_a_dump_says_what_was_wrong_with_its_file(tmp_path: Path, data: bytes,
                                                                       words: list[str]) -> None:
    folder = write(tmp_path, {r: dump(history("0", 5, pending=1)) for r in (0, 1, 3)})
    (folder / "rank_2.pkl").write_bytes(data)
    [candidate] = triage_path(folder, world_size=4).candidates
    assert candidate.rank == 2 and candidate.kind is CandidateKind.STOPPED_REPORTING
    text = " ".join(candidate.reasons)
    assert all(word in text for word in words), text


def test_a_dump_exactly_at_the_size_cap_is_read_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    body = pickle.dumps(dump(history("0", 5)), protocol=2)
    folder = write(tmp_path, {r: dump(history("0", 5)) for r in (0, 1)})
    (folder / "rank_2.pkl").write_bytes(body)
    (folder / "rank_3.pkl").write_bytes(body + b"\n")  # trailing bytes after STOP are ignored
    result = triage_path(folder, world_size=4, options=TriageOptions(max_dump_bytes=len(body)))
    assert 2 in result.ranks_with_evidence
    [skipped] = result.skipped_files
    assert skipped.rank == 3 and f"{len(body)}-byte cap" in skipped.reason
