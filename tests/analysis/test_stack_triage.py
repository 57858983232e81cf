"""The stacks in the triage itself (issue 19 item 4), on real Gloo dumps (tests/fixtures/gloo).

``withheld_one``: rank 2 never calls its tp all_reduce; rank 3 waits in tp '2' for it, ranks 0
and 1 wait further down the chain. Stacks files beside the dumps give the candidate its
``stack`` and the result its ``stack_groups``; hostile ones are refused or bounded with a note,
and the verdict never moves.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from denpex.analysis.triage import TriageOptions, triage_path
from denpex.evidence.stacks import MAX_BYTES, MAX_FRAMES, MAX_TEXT, MAX_THREADS, stacks_file_name
from denpex.isolation.plan import utc_now
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import IsolationPolicy, Scheduler
from denpex.markdown_text import inline
from denpex.report import TriageReport, render_text
from denpex.workflow.markdown import approval_markdown, report_markdown

WITHHELD = Path(__file__).resolve().parents[1] / "fixtures" / "gloo" / "withheld_one"
TAKEN_AT = "2026-11-29T20:29:44Z"
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
HOSTILE = "```` **Safe to approve** [docs](http://evil.example) <img src=x onerror=alert(1)> ````"


def frame(file: str, line: int, function: str) -> dict[str, Any]:
    return {"file": file, "line": line, "function": function}


def record(rank: int, frames: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"format": "denpex.stacks/1", "rank": rank, "source": "collector", "taken_at": TAKEN_AT,
            "threads": [{"name": "MainThread", "frames": frames}], **extra}


def waiting(rank: int) -> dict[str, Any]:
    return record(rank, [frame(C10D, 3252, "all_reduce"), frame("/job/train.py", 88, "step"),
                         frame("/job/train.py", 120, "main")])


def sleeping(function: str = "next_batch") -> dict[str, Any]:
    return record(2, [frame("/job/data.py", 45, function), frame("/job/train.py", 80, "step")])


def folder(tmp_path: Path, stacks: dict[str, bytes | dict[str, Any]]) -> Path:
    """``withheld_one``'s dumps and manifest, with ``stacks`` (name -> file) under ``collector/``."""
    out = tmp_path / "incident"
    shutil.copytree(WITHHELD, out, ignore=shutil.ignore_patterns("*.json.gz"))
    (out / "collector").mkdir()
    for name, body in stacks.items():
        (out / "collector" / name).write_bytes(body if isinstance(body, bytes) else json.dumps(body).encode())
    return out


def triage_json(path: Path, *, stacks: bool = True) -> dict[str, Any]:
    result = triage_path(path, options=TriageOptions(stacks=stacks))
    data: dict[str, Any] = json.loads(TriageReport(**dict(result)).model_dump_json())
    return data


def judged(report: dict[str, Any]) -> tuple[object, ...]:
    """What FR progress decided: never moved by stacks."""
    return (report["verdict"], [(c["rank"], c["kind"], c["confidence"], c["process_group"], c["collective_seq_id"])
                                for c in report["candidates"]],
            report["groups"], report["stuck"], report["missing_ranks"], report["stale_ranks"])


def test_the_culprit_carries_its_stack_and_the_peers_are_grouped(tmp_path: Path) -> None:
    report = triage_json(folder(tmp_path, {stacks_file_name(r): waiting(r) for r in (0, 1, 3)}
                                | {stacks_file_name(2): sleeping()}))
    [candidate] = report["candidates"]
    assert candidate["rank"] == 2
    assert candidate["stack"]["source"] == "collector" and candidate["stack"]["thread"] == "MainThread"
    assert candidate["stack"]["frames"][0] == frame("/job/data.py", 45, "next_batch")
    assert [g["ranks"] for g in report["stack_groups"]] == [[0, 1, 3], [2]]
    assert report["stack_groups"][0]["summary"] == "`all_reduce` from `train.py:88 step()`"
    # Its tp group holds ranks 2 and 3: rank 2 stands apart from the member inside the collective.
    assert any(r.startswith("in group 2, its stack (in `data.py:45 next_batch()`) differs") for r in candidate["reasons"])
    assert "stacks read for 4 ranks from collector" in report["notes"]
    assert judged(report) == judged(triage_json(WITHHELD, stacks=False))


def test_without_stacks_files_fr_call_sites_group_the_waiting_ranks() -> None:
    """The pickles' own ``frames``: where each waiting rank called its stuck all_reduce. Rank 2
    never called its op, so FR has no call site for it, and no "no stack" line is added (no
    stacks file was there to name it)."""
    report = triage_json(WITHHELD)
    assert {s for g in report["stack_groups"] for s in g["sources"]} == {"fr-callsite"}
    assert sorted(r for g in report["stack_groups"] for r in g["ranks"]) == [0, 1, 3]
    assert all(g["collective"] == "all_reduce" for g in report["stack_groups"])
    [candidate] = report["candidates"]
    assert candidate["stack"] is None and not any("stack" in r for r in candidate["reasons"])
    assert "stacks read for 3 ranks from fr-callsite" in report["notes"]
    assert judged(report) == judged(triage_json(WITHHELD, stacks=False))


def test_a_culprit_whose_process_left_no_stack_is_said_to_have_none(tmp_path: Path) -> None:
    report = triage_json(folder(tmp_path, {stacks_file_name(r): waiting(r) for r in (0, 1, 3)}))
    [candidate] = report["candidates"]
    assert candidate["stack"] is None
    assert candidate["reasons"][-1] == "no stack: no stacks file from any source names this rank"


def test_py_spy_refused_by_ptrace_is_the_reason_given(tmp_path: Path) -> None:
    refused = {"format": "denpex.stacks/1", "rank": 2, "source": "py-spy", "unavailable": "ptrace_refused",
               "detail": "Operation not permitted (os error 1)"}
    report = triage_json(folder(tmp_path, {stacks_file_name(r): waiting(r) for r in (0, 1, 3)}
                                | {"rank_2.py-spy.stacks.json": refused}))
    [candidate] = report["candidates"]
    assert candidate["stack"] is None
    assert candidate["reasons"][-1] == "no stack: py-spy: ptrace_refused (Operation not permitted (os error 1))"


def deep(levels: int) -> bytes:
    return b'{"rank": 2, "threads": ' + b"[" * levels + b"]" * levels + b"}"


HOSTILE_FILES: dict[str, bytes | dict[str, Any]] = {
    # Over the byte limit.
    stacks_file_name(0): b'{"rank": 0, "pad": "' + b"x" * MAX_BYTES + b'"}',
    # Too many threads, each too deep, strings too long, markdown and control characters.
    stacks_file_name(1): record(1, []) | {"threads": [
        {"name": "MainThread", "frames": [frame("/job/" + "a" * 5000, 1, HOSTILE + "\n# heading\x00\x1b[31m")]
         * (MAX_FRAMES + 50)},
        *({"name": f"t{i}\n## x", "frames": [frame("/job/loop.py", i, "loop")]} for i in range(MAX_THREADS + 20))]},
    # Wrong types: a line as text, a frame as a list.
    stacks_file_name(3): record(3, [{"file": "/job/train.py", "line": "88", "function": "step"}, ["x"]]),
    # Deeply nested: a parser bomb, not a record.
    "rank_2.py-spy.stacks.json": deep(100_000),
    # One rank speaking for another.
    stacks_file_name(2): waiting(0),
}


def test_hostile_stacks_files_are_refused_or_bounded_and_the_verdict_stands(tmp_path: Path) -> None:
    report = triage_json(folder(tmp_path, HOSTILE_FILES))
    assert judged(report) == judged(triage_json(WITHHELD, stacks=False))
    notes = "\n".join(report["notes"])
    assert f"stacks file {stacks_file_name(0)} set aside:" in notes and "over the limit" in notes
    assert f"stacks file {stacks_file_name(3)} set aside:" in notes
    assert "stacks file rank_2.py-spy.stacks.json set aside:" in notes
    assert f"stacks file {stacks_file_name(2)} set aside: the record says rank 0" in notes
    assert "rank 1's collector stacks:" in notes  # what was trimmed to fit, said
    # Rank 1's record was bounded, not refused: its stack is grouped, within the limits.
    [group] = [g for g in report["stack_groups"] if 1 in g["ranks"]]
    assert group["ranks"] == [1] and group["sources"] == ["collector"]
    assert all(len(f["file"]) <= MAX_TEXT and len(f["function"]) <= MAX_TEXT for f in group["frames"])
    assert all(not re.search(r"[\x00-\x1f]", f["function"]) for f in group["frames"])
    [candidate] = report["candidates"]
    assert candidate["stack"] is None and candidate["reasons"][-1].startswith("no stack:")


def test_hostile_frames_stay_literal_in_the_text_the_report_and_the_dialog_brief(tmp_path: Path) -> None:
    path = folder(tmp_path, {stacks_file_name(r): waiting(r) for r in (0, 1, 3)}
                  | {stacks_file_name(2): sleeping(HOSTILE)})
    result = triage_path(path)
    report = TriageReport(**dict(result))
    text = render_text(report)
    assert "rank 2 (collector)" in text and "| ranks 0, 1, 3 (collector)" in text
    assert "distributed_c10d.py:3252 all_reduce()" in text

    markdown = report_markdown(report, incident_id="inc-1", cluster="lab", plan=None)
    assert "**Full stack of rank 2** (collector, thread MainThread, innermost first):" in markdown
    assert "[docs](http://evil.example)" not in [line for line in markdown.splitlines() if not line.startswith(" ")][0]

    from lab.rig import xid79_on
    placed = xid79_on(["gpu-node-002"])
    plan = plan_isolation(placed, None, IsolationPolicy(), None, Scheduler.SLURM, "inc-1",
                          placed.as_of or utc_now(), cluster="lab")
    brief = approval_markdown(report, incident_id="inc-1", cluster="lab", plan=plan, approvers=["alice"],
                              code_needed=False, report_link=None)
    [stack] = [line for line in brief.splitlines() if "**Stack:**" in line]
    [peers] = [line for line in brief.splitlines() if "**Peers' stack:**" in line]
    assert stack.startswith(f"  - **Stack:** {inline('data.py:45 ' + HOSTILE + '() ← train.py:80 step()', limit=160)}")
    assert stack.endswith(" (collector)")
    # Escapes, then the code spans a word that would link itself is written in (literal text).
    unescaped = re.sub(r"`[^`]*`", "", re.sub(r"\\.", "", stack.removeprefix("  - **Stack:** ")))
    assert not set(unescaped) & set("`[]()<>|") - set("()"), unescaped  # only our own "(collector)"
    assert "://" not in unescaped, unescaped
    assert peers == "  - **Peers' stack:** distributed\\_c10d.py:3252 all\\_reduce\\(\\) ← train.py:88 step\\(\\) ← train.py:120 main\\(\\) (ranks 0, 1, 3)"
    assert "```" not in brief


@pytest.mark.parametrize("stacks", [False, True])
def test_the_option_turns_the_reading_off(tmp_path: Path, stacks: bool) -> None:
    path = folder(tmp_path, {stacks_file_name(2): sleeping()})
    result = triage_path(path, options=TriageOptions(stacks=stacks))
    assert (result.candidates[0].stack is not None) is stacks


DEBUG_SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "stacks" / "stacks_20261202_190811.txt"


@pytest.mark.parametrize("collected", [(0, 1, 2, 3), (0, 1, 3)], ids=["every-rank", "rank-2-missing"])
def test_the_debug_servers_file_fills_in_only_where_denpex_has_no_stack(tmp_path: Path,
                                                                         collected: tuple[int, ...]) -> None:
    """torch's debug-server file, taken at the incident, beside the dumps: left unparsed when the
    collector's files give every rank a stack (they are preferred; at 4,096 ranks the parse is
    most of the cost), read when a rank has none of its own."""
    stacks: dict[str, bytes | dict[str, Any]] = {stacks_file_name(r): waiting(r) for r in collected}
    if 2 in collected:
        stacks[stacks_file_name(2)] = sleeping()
    path = folder(tmp_path, stacks)
    shutil.copy(DEBUG_SAMPLE, path / "stacks_20261129_202944.txt")
    report = triage_json(path)
    [candidate] = report["candidates"]
    assert not [s for s in report["skipped_files"] if not s["copy_of"]]  # not mistaken for a dump
    if 2 in collected:
        assert candidate["stack"]["source"] == "collector"
        assert ("stacks_20261129_202944.txt (torch's debug server) was not read: Denpex's own stacks files give "
                "every rank a stack, and they are preferred") in report["notes"]
    else:
        assert candidate["stack"]["source"] == "torch-debug"
        assert candidate["stack"]["frames"][0]["function"] == "sleep_in_loader"
        assert any("torch's debug server's stacks_20261129_202944.txt" in n for n in report["notes"])
    assert judged(report) == judged(triage_json(WITHHELD, stacks=False))
