"""Stack evidence readers: the real samples (torch's debug server, py-spy), Denpex's own files,
FR call sites from a real Gloo pickle, and hostile input of every kind, refused or bounded.

The live sources (a real debug-server job, py-spy on a wedged process, the collector in a Gloo
job) are in tests/gloo_real/test_gloo_stacks.py and tests/collector/test_stacks_capture.py.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from denpex.evidence.dump_ref import DumpRef
from denpex.evidence.safe_pickle import safe_loads
from denpex.evidence.stacks import (
    MAX_BYTES,
    MAX_FRAMES,
    MAX_TEXT,
    MAX_THREADS,
    RankStacks,
    StackError,
    StackFrame,
    StackSource,
    ThreadStack,
    Unavailable,
    debug_stacks_files,
    fr_callsite_stacks,
    nearest_debug_stacks,
    parse_debug_stacks,
    parse_pyspy_dump,
    parse_stacks_record,
    read_collected_stacks,
    read_debug_stacks,
    read_fr_callsites,
    stacks_file_name,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "stacks"
DEBUG_SAMPLE = FIXTURES / "stacks_20261202_190811.txt"
PYSPY_SAMPLE = FIXTURES / "pyspy_regex_wedge.json"
GLOO = Path(__file__).parent.parent / "fixtures" / "gloo" / "withheld_one"


def record(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"format": "denpex.stacks/1", "rank": 2, "source": "collector",
                            "taken_at": "2026-12-02T19:08:11Z", "pid": 4242,
                            "threads": [{"name": "MainThread", "id": 140, "frames": [
                                {"file": "/job/data.py", "line": 45, "function": "next_batch"},
                                {"file": "/job/train.py", "line": 88, "function": "step"}]}]}
    base.update(overrides)
    return base


def encode(value: object) -> bytes:
    return json.dumps(value).encode()


# -- torch's debug server ----------------------------------------------------------------------

def test_real_debug_server_file_gives_every_rank_with_its_main_thread() -> None:
    [found] = debug_stacks_files(FIXTURES)
    assert found.taken_at == datetime(2026, 12, 2, 19, 8, 11, tzinfo=UTC)
    stacks = read_debug_stacks(FIXTURES, found)
    assert sorted(stacks.ranks) == [0, 1, 2, 3]
    assert stacks.notes == []
    rank2 = stacks.ranks[2]
    assert rank2.source is StackSource.TORCH_DEBUG and rank2.taken_at == found.taken_at
    main = rank2.thread("MainThread")
    assert main is not None
    assert main.frames[0] == StackFrame(file="/tmp/dbg/job.py", line=7, function="sleep_in_loader")
    rank0_main = stacks.ranks[0].thread("MainThread")
    assert rank0_main is not None and rank0_main.frames[0].function == "all_reduce"
    # faulthandler's "Current thread" served the request: it is never called MainThread.
    assert [t.name for t in stacks.ranks[0].threads] == [None, "MainThread"]


def test_debug_server_section_of_a_rank_it_could_not_fetch_says_so() -> None:
    text = DEBUG_SAMPLE.read_text()
    start = text.index("=== Rank 2:")
    end = text.index("=== Rank 3:")
    partial = ("PARTIAL DATA: 3/4 workers responded\n  Rank 2: Cannot connect to host vm:43529\n\n"
               + text[:start] + "=== Rank 2: http://vm:43529/handler/dump_traceback? ===\nError: 500\n"
               + text[end:])
    stacks = parse_debug_stacks(partial.encode())
    assert stacks.ranks[2].unavailable is Unavailable.WORKER_UNREACHABLE
    assert stacks.ranks[2].detail is not None and "Cannot connect to host vm:43529" in stacks.ranks[2].detail
    assert stacks.ranks[3].thread("MainThread") is not None


@pytest.mark.parametrize(("data", "message"), [
    pytest.param(b"hello\nworld\n", "no '=== Rank i: ... ===' section", id="not-a-stacks-file"),
    pytest.param(b"", "no '=== Rank i", id="empty"),
])
def test_debug_server_file_without_sections_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(StackError, match=message):
        parse_debug_stacks(data)


def test_debug_server_hostile_sections_are_bounded_or_set_aside() -> None:
    evil_fn = "step`](http://evil)\x1b[31m<img src=x>\r\n## injected"
    frames = "".join(f'  File "/job/deep.py", line {i} in f{i}\n' for i in range(MAX_FRAMES + 50))
    text = ("=== Rank 0: a ===\nThread 0x1 (most recent call first):\n" + frames
            + f'  File "/job/train.py", line 88 in {evil_fn}\n  File "/job/train.py", line 9 in <module>\n'
            + "=== Rank 0: again ===\nThread 0x2 (most recent call first):\n  File \"x\", line 1 in y\n"
            + "=== Rank 1: b ===\n" + "x" * (MAX_BYTES + 10) + "\n"
            + "=== Rank 2: c ===\nsomething else\nThread 0x3 (most recent call first):\n"
            + '  File "/job/train.py", line 5 in <module>\n')
    stacks = parse_debug_stacks(text.encode())
    assert sorted(stacks.ranks) == [0, 2]
    rank0 = stacks.ranks[0].threads[0]
    assert len(rank0.frames) == MAX_FRAMES and rank0.frames_dropped == 52
    assert rank0.frames[0].function == "f0"  # the innermost frames are the ones kept
    assert any("rank 0 has more than one section" in n for n in stacks.notes)
    assert any("rank 1" in n and "over the limit" in n for n in stacks.notes)
    assert stacks.ranks[2].notes == ["1 line(s) that are not faulthandler's were skipped"]


def test_debug_server_file_over_the_byte_limit_is_refused(tmp_path: Path) -> None:
    from denpex.evidence.stacks.torch_debug import DEBUG_FILE_MAX_BYTES

    with pytest.raises(StackError, match="over the limit"):
        parse_debug_stacks(b"=" * (DEBUG_FILE_MAX_BYTES + 1))


def test_the_debug_file_nearest_the_dump_time_is_chosen(tmp_path: Path) -> None:
    for stamp in ("20261202_190700", "20261202_190800", "20261202_191500"):
        (tmp_path / f"stacks_{stamp}.txt").write_text("=== Rank 0: a ===\n")
    (tmp_path / "stacks_garbage.txt").write_text("x")
    (tmp_path / "fr_trace_20261202_190800.txt").write_text("x")
    files = debug_stacks_files(tmp_path)
    assert [f.name for f in files] == ["stacks_20261202_190700.txt", "stacks_20261202_190800.txt",
                                           "stacks_20261202_191500.txt"]
    dump_time = datetime(2026, 12, 2, 19, 8, 30, tzinfo=UTC)
    chosen = nearest_debug_stacks(files, dump_time)
    assert chosen is not None and chosen.name == "stacks_20261202_190800.txt"
    assert nearest_debug_stacks(files, dump_time + timedelta(hours=1)) is None
    assert nearest_debug_stacks([], dump_time) is None


# -- py-spy --------------------------------------------------------------------------------------

def test_real_pyspy_output_names_the_function_holding_the_gil() -> None:
    stacks = parse_pyspy_dump(PYSPY_SAMPLE.read_bytes(), rank=9, pid=11683)
    main = stacks.thread("MainThread")
    assert main is not None and main.holds_gil is True and main.active is True
    assert [(f.function, f.line) for f in main.frames[:2]] == [("match", 166), ("wedge_in_regex", 5)]
    helper = stacks.thread("helper")
    assert helper is not None and helper.holds_gil is False
    assert stacks.source is StackSource.PY_SPY and stacks.pid == 11683


@pytest.mark.parametrize(("payload", "message"), [
    pytest.param({"threads": []}, "not py-spy's list of threads", id="object-not-list"),
    pytest.param([1], "thread 0 is a int", id="thread-not-object"),
    pytest.param([{"thread_name": "x"}], "thread 0 has no list of frames", id="no-frames"),
    pytest.param([{"frames": ["f"]}], "a frame of thread 0 is a str", id="frame-not-object"),
    pytest.param([{"frames": [{"name": "f", "filename": "a.py", "line": "88"}]}], "line", id="line-as-text"),
    pytest.param([{"frames": [{"name": ["f"], "filename": "a.py", "line": 1}]}], "function", id="name-as-list"),
])
def test_pyspy_output_of_the_wrong_shape_is_refused(payload: object, message: str) -> None:
    with pytest.raises(StackError, match=message):
        parse_pyspy_dump(encode(payload), rank=1)


# -- Denpex's own stacks files --------------------------------------------------------------------

def test_a_collector_record_round_trips() -> None:
    stacks = parse_stacks_record(encode(record()))
    assert stacks.rank == 2 and stacks.source is StackSource.COLLECTOR
    again = parse_stacks_record(stacks.model_dump_json().encode())
    assert again == stacks


def test_strings_with_markdown_and_control_characters_are_flattened_and_cut() -> None:
    evil = "step\n## injected\x00\x1b[31m`](javascript:x)" + "y" * (MAX_TEXT * 3)
    raw = record(threads=[{"name": "Main\u2028Thread", "frames": [{"file": evil, "line": 1, "function": evil}]}])
    stacks = parse_stacks_record(encode(raw))
    frame = stacks.threads[0].frames[0]
    assert len(frame.function) == MAX_TEXT and frame.function.endswith("…")
    assert not any(c in frame.function + frame.file + (stacks.threads[0].name or "") for c in "\n\x00\x1b\u2028")
    assert f"strings over {MAX_TEXT} characters were cut" in stacks.notes
    assert "control characters in strings became spaces" in stacks.notes


def test_too_many_threads_keep_the_main_thread_and_say_so() -> None:
    threads = [{"name": f"worker-{i}", "frames": []} for i in range(MAX_THREADS + 40)]
    threads.append({"name": "MainThread", "frames": [{"file": "/job/t.py", "line": 1, "function": "f"}]})
    stacks = parse_stacks_record(encode(record(threads=threads)))
    assert len(stacks.threads) == MAX_THREADS and stacks.threads_dropped == 41
    assert stacks.threads[0].name == "MainThread"
    assert any("over the limit of 256: kept 256" in n for n in stacks.notes)


def test_too_many_frames_keep_the_innermost() -> None:
    frames = [{"file": "/job/t.py", "line": i, "function": f"f{i}"} for i in range(MAX_FRAMES * 3)]
    stacks = parse_stacks_record(encode(record(threads=[{"name": "MainThread", "frames": frames}])))
    kept = stacks.threads[0]
    assert [f.line for f in kept.frames] == list(range(MAX_FRAMES))
    assert kept.frames_dropped == MAX_FRAMES * 2


@pytest.mark.parametrize(("data", "message"), [
    pytest.param(b"{" + b" " * MAX_BYTES + b"}", "over the limit of 4,194,304: refused", id="over-bytes"),
    pytest.param(b"", "empty", id="empty"),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "nests too deeply", id="deep-nesting"),
    pytest.param(encode(record(threads=[[[[[[[[{"name": "x"}]]]]]]]])), r"threads\.0", id="nested-in-a-field"),
    pytest.param(b"\xff\xfe", "not UTF-8 JSON", id="not-utf8"),
    pytest.param(b'{"rank": 1', "not valid JSON", id="cut-short"),
    pytest.param(encode([record()]), "holds a list", id="list-not-object"),
    pytest.param(encode(record(rank=-1)), "rank", id="negative-rank"),
    pytest.param(encode(record(rank="2")), "rank", id="rank-as-text"),
    pytest.param(encode(record(source="gdb")), "source", id="unknown-source"),
    pytest.param(encode(record(format="other/9")), "format", id="other-format"),
    pytest.param(encode(record(threads="MainThread")), "threads", id="threads-as-text"),
    pytest.param(encode(record(threads=[{"frames": [{"file": "a", "line": 1}]}])), "function", id="missing-field"),
    pytest.param(encode(record(extra=1)), "extra", id="unknown-field"),
    pytest.param(encode(record(notes="x")), "notes", id="notes-as-text"),
    pytest.param(encode(record(threads=[{"frames": [{"file": "a", "line": 10**30, "function": "f"}]}])), "line",
                 id="huge-line"),
])
def test_hostile_stacks_files_are_refused_with_a_reason(data: bytes, message: str) -> None:
    with pytest.raises(StackError, match=message):
        parse_stacks_record(data, what="rank_2.stacks.json")


def test_a_folder_s_stacks_files_are_read_and_a_file_speaking_for_another_rank_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "collector"
    folder.mkdir()
    (folder / stacks_file_name(2)).write_bytes(encode(record()))
    (folder / stacks_file_name(3)).write_bytes(encode(record()))  # says rank 2
    (folder / stacks_file_name(1, StackSource.PY_SPY)).write_bytes(
        encode(record(rank=1, source="py-spy", threads=[], unavailable="ptrace_refused",
                      detail="Permission Denied")))
    (folder / stacks_file_name(0)).write_bytes(b"{")
    (folder / "rank_0.record.json").write_text("{}")
    found = read_collected_stacks(tmp_path)
    assert [(r.rank, r.source) for r in found.records] == [(1, StackSource.PY_SPY), (2, StackSource.COLLECTOR)]
    assert found.records[0].unavailable is Unavailable.PTRACE_REFUSED
    assert "not what its name says" in found.refused["rank_3.stacks.json"]
    assert "not valid JSON" in found.refused["rank_0.stacks.json"]


def test_the_model_itself_holds_the_bounds() -> None:
    with pytest.raises(ValueError):
        ThreadStack(frames=[StackFrame(file="a", line=1, function="f")] * (MAX_FRAMES + 1))
    with pytest.raises(ValueError):
        RankStacks(rank=0, source=StackSource.COLLECTOR, threads=[ThreadStack()] * (MAX_THREADS + 1))
    with pytest.raises(ValueError, match="pattern"):
        StackFrame(file="a\nb", line=1, function="f")  # readers clean strings; a direct caller must
    with pytest.raises(ValueError, match="at most 512 characters"):
        StackFrame(file="a" * (MAX_TEXT + 1), line=1, function="f")


def test_no_stacks_file_is_written_for_sources_that_have_none() -> None:
    with pytest.raises(ValueError, match="torch-debug"):
        stacks_file_name(0, StackSource.TORCH_DEBUG)


# -- FR call sites --------------------------------------------------------------------------------

def test_fr_call_site_of_the_stuck_op_from_a_real_gloo_pickle() -> None:
    raw = safe_loads((GLOO / "rank_0.pkl").read_bytes())
    stacks = fr_callsite_stacks(raw, rank=0, group_name="3", seq_id=3)
    assert stacks is not None and stacks.source is StackSource.FR_CALLSITE
    [thread] = stacks.threads
    assert thread.name == "python" and thread.id == 139642850589568
    assert [(f.function, f.line) for f in thread.frames[:3]] == [("all_reduce", 3245), ("wrapper", 83), ("step", 74)]
    assert fr_callsite_stacks(raw, rank=0, group_name="3", seq_id=99) is None
    assert fr_callsite_stacks(raw, rank=0, group_name="3", seq_id=3, p2p=True) is None


def test_fr_json_dumps_have_no_call_sites() -> None:
    raw = json.loads((GLOO / "rank_0.json").read_bytes())
    assert fr_callsite_stacks(raw, rank=0, group_name="3", seq_id=3) is None


@pytest.mark.parametrize(("frames", "message"), [
    pytest.param(["all_reduce"], "is a str, not a mapping", id="frame-as-text"),
    pytest.param([{"name": "f", "filename": "a.py", "line": None}], "line", id="line-none"),
])
def test_hostile_fr_frames_are_refused(frames: list[object], message: str) -> None:
    raw = {"entries": [{"process_group": ("0", "default_pg"), "collective_seq_id": 1, "is_p2p": False,
                        "frames": frames}]}
    with pytest.raises(StackError, match=message):
        fr_callsite_stacks(raw, rank=0, group_name="0", seq_id=1)



def test_call_sites_read_from_a_folder_s_dumps_for_a_few_ranks(tmp_path: Path) -> None:
    """Rank 0's pickle (the committed real Gloo run) gives its call site; a JSON dump, a hostile
    pickle and a missing file give none, each with its reason, and nothing in the pickle runs."""
    (tmp_path / "rank_1.pkl").write_bytes(b"\x80\x02cos\nsystem\n")  # a hostile pickle stands in for a rank
    refs = [DumpRef(store_uri=str(GLOO), name="rank_0.pkl", rank=0, size=0),
            DumpRef(store_uri=str(GLOO), name="rank_0.json", rank=5, size=0),
            DumpRef(store_uri=str(tmp_path), name="rank_1.pkl", rank=1, size=0),
            DumpRef(store_uri=str(tmp_path), name="rank_9.pkl", rank=9, size=0)]
    found = read_fr_callsites(refs, group_name="3", seq_id=3, max_bytes=64 << 20)
    assert [(r.rank, r.threads[0].frames[2].function) for r in found.records] == [(0, "step")]
    assert "JSON dumps carry none" in found.missing[5]
    assert "os.system" in found.missing[1] and "nothing in it ran" in found.missing[1]
    assert sorted(found.missing) == [1, 5, 9]
