"""Hostile or corrupt values inside an otherwise well-formed dump.

Ranks 0, 1 and 3 wait in world collective #6; rank 2's dump is the one under test. Whatever its
fields hold, the triage finishes, names the file when it sets it aside, and never lets rank 2
look like a rank that entered #6.
"""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from denpex.analysis.models import CandidateKind, Verdict
from denpex.analysis.summary import summarize_dump
from denpex.analysis.triage import triage_path
from denpex.evidence.errors import DumpError
from denpex.evidence.fr_dump import decode_dump, parse_version
from denpex.report import TriageReport, render_text
from dumps import dump, entry, history, write

HUGE = 10**5000  # more digits than Python will turn into text (sys.int_info.default_max_str_digits)
DEEP = "DEEP_PLACEHOLDER"


def deep_pickle(body: object, depth: int = 100_000) -> bytes:
    """``body`` pickled with the string ``DEEP`` replaced by a list nested ``depth`` levels deep.

    The C unpickler builds such a list without recursing; anything that later walks it
    recursively (``str``, ``repr``, pydantic) hits the recursion limit.
    """
    data = pickle.dumps(body, protocol=2)
    op = b"X" + struct.pack("<I", len(DEEP)) + DEEP.encode()
    assert data.count(op) == 1
    return data.replace(op, b"]" * depth + b"a" * (depth - 1))


def rank2_waiting(**fields: Any) -> dict[str, Any]:
    """Rank 2 in #6 like its peers, with ``fields`` overriding the in-flight entry."""
    return dump(history("0", 5) + [dict(entry("0", 6, retired=False, record_id=5), **fields)])


def triage_with_rank2(tmp_path: Path, data: bytes, name: str = "rank_2.pkl") -> Any:
    folder = write(tmp_path, {r: dump(history("0", 5, pending=1)) for r in (0, 1, 3)},
                   manifest={"world_size": 4, "ranks": {str(r): {"host": f"node-{r}"} for r in range(4)},
                             "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}})
    (folder / name).write_bytes(data)
    result = triage_path(folder)
    # The text report and the JSON form must render too: a crash there is a crash of the triage.
    report = TriageReport(**result.model_dump())
    render_text(report)
    report.model_dump_json()
    return result


def _pickle(body: object) -> bytes:
    return pickle.dumps(body, protocol=2)


CRASHERS = [
    pytest.param(_pickle(dump(history("0", 5)) | {"version": "\u00b2.10"}), id="superscript-version"),
    pytest.param(b'{"version": "2.10", "entries": [], "x": ' + b"9" * 5000 + b"}", id="json-5000-digit-int"),
    pytest.param(_pickle(rank2_waiting(collective_seq_id=HUGE)), id="huge-collective-seq-id"),
    pytest.param(_pickle(rank2_waiting(profiling_name="nccl:send 0->1", is_p2p=True, p2p_seq_id=HUGE)),
                 id="huge-p2p-seq-id"),
    pytest.param(_pickle(rank2_waiting(profiling_name="nccl:send 0->" + "9" * 5000, is_p2p=True)),
                 id="huge-p2p-peer"),
    pytest.param(_pickle(rank2_waiting(input_sizes=[[HUGE]])), id="huge-tensor-size"),
    pytest.param(_pickle(rank2_waiting(time_created_ns=10**30)), id="time-beyond-any-calendar"),
    pytest.param(_pickle(rank2_waiting(record_id=HUGE)), id="huge-record-id"),
    pytest.param(_pickle(rank2_waiting(timeout_ms=HUGE)), id="huge-timeout"),
    pytest.param(deep_pickle(rank2_waiting(input_dtypes=DEEP)), id="deep-dtypes"),
    pytest.param(deep_pickle(rank2_waiting(input_dtypes=[DEEP])), id="deep-dtype"),
    pytest.param(deep_pickle(rank2_waiting(input_sizes=[DEEP])), id="deep-size"),
    pytest.param(deep_pickle(rank2_waiting(profiling_name=DEEP)), id="deep-op-name"),
    pytest.param(deep_pickle(dump(history("0", 5), comm_lib_version=DEEP)), id="deep-comm-lib-version"),
    pytest.param(deep_pickle(dump(history("0", 5), pg_config={"x": {"name": "0", "ranks": DEEP}})),
                 id="deep-pg-config"),
]


@pytest.mark.parametrize("data", CRASHERS)
def test_hostile_values_never_crash_the_triage(tmp_path: Path, data: bytes) -> None:
    result = triage_with_rank2(tmp_path, data)
    assert sorted(result.ranks_with_evidence + result.missing_ranks) == [0, 1, 2, 3]
    # Rank 2 either counts as missing or, on what remains usable, as a suspect: never a victim.
    assert 2 in {c.rank for c in result.candidates} or result.verdict is Verdict.NO_HANG
    if 2 in result.missing_ranks:
        [skipped] = [s for s in result.skipped_files if s.rank == 2]
        assert skipped.path == "rank_2.pkl" and skipped.reason


@pytest.mark.parametrize(
    ("version", "accepted"),
    [
        pytest.param("2.10", (2, 10), id="torch-2.13"),
        pytest.param("2", (2, 0), id="major-only"),
        pytest.param(" 2.4 ", (2, 4), id="spaces"),
        pytest.param("2.x", None, id="letter-minor"),
        pytest.param("", None, id="empty"),
        pytest.param("\u00b2.10", None, id="superscript-two"),
        pytest.param("\u0662.10", None, id="arabic-indic-two"),
        pytest.param("2." + "1" * 5000, None, id="5000-digit-minor"),
        pytest.param(2.1, None, id="float"),
        pytest.param(None, None, id="none"),
    ],
)
def test_parse_version(version: object, accepted: tuple[int, int] | None) -> None:
    if accepted is None:
        with pytest.raises(DumpError, match="version"):
            parse_version(version)
    else:
        assert parse_version(version) == accepted


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        pytest.param({"collective_seq_id": -3}, "collective_seq_id", id="negative-seq"),
        pytest.param({"collective_seq_id": 2**64}, "collective_seq_id", id="seq-beyond-int64"),
        pytest.param({"collective_seq_id": True}, "collective_seq_id", id="bool-seq"),
        pytest.param({"collective_seq_id": "6"}, "collective_seq_id", id="string-seq"),
    ],
)
def test_an_entry_with_an_impossible_seq_id_is_not_used(fields: dict[str, Any], why: str) -> None:
    body = dump([dict(entry("0", 6, retired=False, record_id=5), **fields)])
    with pytest.raises(DumpError, match=why):
        summarize_dump(decode_dump(_pickle(body), source="rank_2.pkl"), rank=2)


def test_a_rank_whose_only_entry_has_a_negative_seq_id_is_missing_not_healthy(tmp_path: Path) -> None:
    result = triage_with_rank2(tmp_path, _pickle(dump([entry("0", -3, retired=False)])))
    assert result.missing_ranks == [2] and "collective_seq_id" in result.skipped_files[0].reason
    assert [(c.rank, c.kind) for c in result.candidates] == [(2, CandidateKind.STOPPED_REPORTING)]


def test_a_negative_timeout_does_not_make_an_op_overdue(tmp_path: Path) -> None:
    """Torch never writes one; reading it as 'timed out long ago' would blame every rank."""
    result = triage_with_rank2(tmp_path, _pickle(rank2_waiting(timeout_ms=-1)))
    # Every rank is in the op and nothing dates it: a weak lead of unknown age (issue 9), never
    # an op "past its timeout".
    [stuck] = result.stuck
    assert "unknown" in stuck.detail and "timeout" not in stuck.detail
    assert all(c.confidence < 0.2 for c in result.candidates)


def test_unusable_entries_are_reported(tmp_path: Path) -> None:
    body = dump(history("0", 5) + [dict(entry("0", 6, retired=False, record_id=5), collective_seq_id=-1),
                                   "junk"])
    result = triage_with_rank2(tmp_path, _pickle(body))
    [candidate] = result.candidates
    assert candidate.rank == 2 and candidate.kind is CandidateKind.NOT_ENTERED
    text = " ".join(result.notes)
    assert "rank_2.pkl" in text and "2 of its 7 entries" in text


# -- truncation at every byte, and arbitrary bytes -----------------------------------------

REAL = Path(__file__).parent.parent / "fixtures" / "gloo" / "withheld_one"
REAL_PICKLE = (REAL / "rank_2.pkl").read_bytes()
REAL_JSON = (REAL / "rank_2.json").read_bytes()


@pytest.mark.parametrize("data", [REAL_PICKLE, REAL_JSON], ids=["pickle", "json"])
def test_every_truncation_of_a_real_dump_is_refused_with_a_reason(data: bytes) -> None:
    for cut in range(len(data)):
        with pytest.raises(DumpError) as info:
            decode_dump(data[:cut], source="rank_2")
        assert str(info.value)
    # Only the trailing newline of the JSON may go.
    assert decode_dump(data.rstrip(), source="rank_2").raw["version"] == "2.10"


def _refused_or_summarized(data: bytes) -> None:
    try:
        decoded = decode_dump(data, source="rank_2")
        summarize_dump(decoded, rank=2)
    except DumpError as exc:
        assert str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_corrupted_real_dumps_are_refused_or_summarized(data: st.DataObject) -> None:
    """Flip, drop or insert bytes anywhere in a real dump: a DumpError or a summary, nothing else."""
    original = bytearray(data.draw(st.sampled_from([REAL_PICKLE, REAL_JSON])))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(original) - 1))
        how = data.draw(st.sampled_from(["flip", "drop", "insert"]))
        byte = data.draw(st.integers(0, 255))
        if how == "flip":
            original[at] = byte
        elif how == "drop":
            del original[at]
        else:
            original.insert(at, byte)
    _refused_or_summarized(bytes(original))


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
    | st.sampled_from([-1, 0, 2**63 - 1, 2**63, 2**64, 10**30, "nccl:send 0->1", "nccl:recv 1<-0",
                       "scheduled", "started", "completed", "nccl:coalesced", ["0", "default_pg"]]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_FIELDS = ["record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id",
           "profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes", "state",
           "time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns", "retired",
           "timeout_ms", "is_p2p"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(overrides=st.dictionaries(st.sampled_from(_FIELDS), _JSON_VALUES, min_size=1, max_size=4),
       as_json=st.booleans())
@example(overrides={"record_id": None, "pg_id": None, "time_created_ns": 1764442807006000001}, as_json=False)
def test_any_field_value_in_the_waiting_entry_is_survived(tmp_path_factory: pytest.TempPathFactory,
                                                          overrides: dict[str, Any], as_json: bool) -> None:
    body = rank2_waiting(**overrides)
    try:
        data = json.dumps(body).encode() if as_json else _pickle(body)
    except ValueError:  # json cannot write HUGE; the pickle carries it
        data, as_json = _pickle(body), False
    result = triage_with_rank2(tmp_path_factory.mktemp("f"), data, "rank_2.json" if as_json else "rank_2.pkl")
    # Every rank is accounted for exactly once. A stale rank is neither fresh evidence nor missing:
    # an in-flight entry 15 minutes newer than its peers' makes the default as-of that late, and
    # the peers' dumps stale (found by hypothesis: time_created_ns 2025-11-29T19:00:07Z).
    accounted = result.ranks_with_evidence + result.missing_ranks + result.stale_ranks
    assert sorted(accounted) == [0, 1, 2, 3], (result.ranks_with_evidence, result.missing_ranks, result.stale_ranks)


def test_shared_references_cannot_blow_up_the_summary() -> None:
    """Pickle memo references let 3,000 entries share one 20,000-tensor size list for a few bytes
    each (a 0.4 MB file). Converting it per entry took a minute and gigabytes."""
    import time

    from denpex.analysis.summary import MAX_SIGNATURE_TENSORS

    shared = [[1, 2]] * 20_000
    entries = [dict(entry(f"g{i}", 1, retired=False, record_id=i), input_sizes=shared, output_sizes=shared)
               for i in range(3_000)]
    data = _pickle(dump(entries))
    assert len(data) < 1_000_000
    # CPU time, not wall time: the bug took a minute of CPU, and a busy CI machine stretches wall
    # time (8.7 s measured for this 0.3 s summary with four test workers on two cores).
    started = time.process_time()
    summary = summarize_dump(decode_dump(data, source="rank_2.pkl"), rank=2)
    assert time.process_time() - started < 5
    signature = summary.groups["g7"].pending[0].signature
    assert len(signature.input_sizes) == MAX_SIGNATURE_TENSORS and signature.input_sizes[0] == (1, 2)


def test_op_names_and_group_descriptions_from_a_dump_print_inert(tmp_path: Path) -> None:
    """Hostile review: the CLI's text report printed a dump's op name and group description as
    they were, so a terminal escape (``\\x1b[2J`` clears the screen, OSC 8 draws a link) or a bidi
    override in them reached the operator's terminal. They are written out as codes instead."""
    data = _pickle(rank2_waiting(profiling_name="gloo:\x1b[2Jall_reduce\u202e",
                                 process_group=("0", "\x1b]8;;http://evil\x07default_pg")))
    result = triage_with_rank2(tmp_path, data)
    text = render_text(TriageReport(**result.model_dump()))
    assert not {"\x1b", "\x07", "\u202e"} & set(text + result.model_dump_json()), text
    assert "\\x1b[2Jall_reduce\\u202e" in text or "\\x1b[2Jall_reduce\\u202e" in result.model_dump_json()
