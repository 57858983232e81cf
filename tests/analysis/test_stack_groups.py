"""Grouping ranks by stack signature and naming the outliers of a stuck group.

Built on the real debug-server sample (4 real Gloo ranks: 0, 1, 3 in all_reduce, 2 asleep) and on
py-spy's real output for a regex-wedged process; synthetic stacks only for the edge cases.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from denpex.analysis.stack_groups import (
    FrameRole,
    StackGrouping,
    best_stacks,
    candidate_stack,
    frame_role,
    group_by_stack,
    issuing_thread,
    render_outlier,
    render_stack_groups,
    stack_groups_markdown,
    stack_outliers,
    stack_signature,
)
from denpex.evidence.stacks import (
    RankStacks,
    StackFrame,
    StackSource,
    ThreadStack,
    Unavailable,
    debug_stacks_files,
    parse_pyspy_dump,
    parse_stacks_record,
    read_debug_stacks,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "stacks"
C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"


def f(file: str, line: int, function: str) -> StackFrame:
    return StackFrame(file=file, line=line, function=function)


IN_ALL_REDUCE = [f(C10D, 3252, "all_reduce"), f(LOGGER, 83, "wrapper"), f("/job/train.py", 88, "step"),
                 f("/job/train.py", 120, "main"), f("/job/train.py", 130, "<module>")]
ASLEEP = [f("/job/data.py", 45, "next_batch"), f("/job/train.py", 86, "step"), f("/job/train.py", 120, "main")]


def rank(r: int, frames: list[StackFrame], *, source: StackSource = StackSource.COLLECTOR,
         name: str | None = "MainThread", extra: list[ThreadStack] | None = None) -> RankStacks:
    return RankStacks(rank=r, source=source, threads=[*(extra or []), ThreadStack(name=name, frames=frames)])


def debug_sample() -> dict[int, RankStacks]:
    return read_debug_stacks(FIXTURES, debug_stacks_files(FIXTURES)[0]).ranks


@pytest.mark.parametrize(("file", "role"), [
    pytest.param(C10D, FrameRole.COLLECTIVE, id="c10d"),
    pytest.param(LOGGER, FrameRole.LIBRARY, id="torch-internal"),
    pytest.param("/usr/lib/python3.11/re/__init__.py", FrameRole.LIBRARY, id="stdlib"),
    pytest.param("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py", FrameRole.LIBRARY, id="pyenv-stdlib"),
    pytest.param("<frozen runpy>", FrameRole.LIBRARY, id="frozen"),
    pytest.param("/venv/lib/python3.11/site-packages/numpy/core.py", FrameRole.LIBRARY, id="site-packages"),
    pytest.param("/work/wt/x/denpex/collector/stacks.py", FrameRole.LIBRARY, id="denpex-collector"),
    pytest.param("/job/train.py", FrameRole.USER, id="user"),
    pytest.param("train.py", FrameRole.USER, id="relative-user"),
])
def test_frame_roles(file: str, role: FrameRole) -> None:
    assert frame_role(f(file, 1, "x")) is role


def test_the_real_debug_server_sample_groups_the_sleeper_apart() -> None:
    grouping = group_by_stack(debug_sample())
    assert [g.ranks for g in grouping.groups] == [[0, 1, 3], [2]]
    peers, sleeper = grouping.groups
    assert peers.collective == "all_reduce"
    assert [fr.function for fr in peers.frames] == ["all_reduce", "step", "main", "<module>"]
    assert peers.sources == [StackSource.TORCH_DEBUG]
    assert sleeper.collective is None and sleeper.frames[0] == f("/tmp/dbg/job.py", 7, "sleep_in_loader")
    assert render_stack_groups(grouping) == [
        "ranks 0, 1, 3: `all_reduce` from `job.py:10 step()`",
        "rank 2: in `job.py:7 sleep_in_loader()`",
    ]
    [outlier] = stack_outliers(grouping, [0, 1, 2, 3])
    assert outlier.rank == 2 and outlier.majority.ranks == [0, 1, 3]
    assert "differs from the majority" in outlier.reason and "ranks 0, 1, 3" in outlier.reason
    assert render_outlier(outlier)[0] == "rank 2: in `job.py:7 sleep_in_loader()`"
    assert "    distributed_c10d.py:3252 all_reduce()" in render_outlier(outlier)


def test_a_wedged_regex_read_by_py_spy_names_the_library_call_and_the_user_function() -> None:
    stacks = parse_pyspy_dump((FIXTURES / "pyspy_regex_wedge.json").read_bytes(), rank=9)
    stack = candidate_stack(stacks)
    assert stack is not None
    assert stack.source is StackSource.PY_SPY and stack.thread == "MainThread"
    assert stack.summary == "`re.match` in `wedge.py:5 wedge_in_regex()`"
    assert [(fr.function, fr.line) for fr in stack.frames] == [("match", 166), ("wedge_in_regex", 5), ("<module>", 7)]
    assert len(stack.all_frames) == 3


def test_the_issuing_thread_is_the_one_in_a_collective_else_main_never_the_collector() -> None:
    dumper = ThreadStack(name="denpex-hang-dumper-0", frames=[f("/x/denpex/collector/stacks.py", 5, "capture")])
    worker = ThreadStack(name="comm", frames=IN_ALL_REDUCE)
    main = ThreadStack(name="MainThread", frames=ASLEEP)
    assert issuing_thread(RankStacks(rank=0, source=StackSource.COLLECTOR, threads=[dumper, main, worker])) == worker
    assert issuing_thread(RankStacks(rank=0, source=StackSource.COLLECTOR, threads=[dumper, main])) == main
    gil = ThreadStack(name=None, holds_gil=True, frames=ASLEEP)
    idle = ThreadStack(name=None, holds_gil=False, frames=ASLEEP[1:])
    assert issuing_thread(RankStacks(rank=0, source=StackSource.PY_SPY, threads=[idle, gil])) == gil
    assert issuing_thread(RankStacks(rank=0, source=StackSource.COLLECTOR, threads=[dumper])) is None


@pytest.mark.parametrize(("frames", "waiting", "collective", "user"), [
    pytest.param(IN_ALL_REDUCE, "all_reduce", "all_reduce", ["step", "main", "<module>"], id="collective"),
    pytest.param(ASLEEP, None, None, ["next_batch", "step", "main"], id="user-innermost"),
    pytest.param([f("/usr/lib/python3.11/threading.py", 327, "Condition.wait"),
                  f("/usr/lib/python3.11/threading.py", 629, "Event.wait"), *ASLEEP],
                 "Event.wait", None, ["next_batch", "step", "main"], id="library-call"),
    pytest.param([f("/job/a.py", 1, "inner"), f("/venv/lib/python3.11/site-packages/torch/nn/module.py", 9, "_call"),
                  f("/job/b.py", 2, "outer"), f("/job/c.py", 3, "top"), f("/job/d.py", 4, "more")],
                 None, None, ["inner", "outer", "top"], id="internals-between-user-frames-skipped"),
    pytest.param([f("/usr/lib/python3.11/threading.py", 327, "Condition.wait")], "Condition.wait", None, [],
                 id="no-user-code"),
])
def test_signatures(frames: list[StackFrame], waiting: str | None, collective: str | None, user: list[str]) -> None:
    signature = stack_signature(ThreadStack(name="MainThread", frames=frames))
    assert (signature.waiting_in.function if signature.waiting_in else None) == waiting
    assert signature.collective == collective
    assert [fr.function for fr in signature.user_frames] == user


def test_library_waits_a_line_apart_still_group_but_user_lines_do_not() -> None:
    wait = "/usr/lib/python3.11/threading.py"
    stacks = {0: rank(0, [f(wait, 320, "Condition.wait"), *ASLEEP]),
              1: rank(1, [f(wait, 324, "Condition.wait"), *ASLEEP]),
              2: rank(2, [f(wait, 320, "Condition.wait"), f("/job/data.py", 46, "next_batch"), *ASLEEP[1:]])}
    assert [g.ranks for g in group_by_stack(stacks).groups] == [[0, 1], [2]]
    assert group_by_stack(stacks).groups[0].summary == "`threading.Condition.wait` in `data.py:45 next_batch()`"


def test_outliers_need_a_reference() -> None:
    pair = group_by_stack({0: rank(0, IN_ALL_REDUCE), 1: rank(1, ASLEEP)})
    [outlier] = stack_outliers(pair, [0, 1])
    assert outlier.rank == 1 and "the members inside the collective" in outlier.reason
    tie = group_by_stack({0: rank(0, ASLEEP), 1: rank(1, ASLEEP[1:])})
    assert stack_outliers(tie, [0, 1]) == []
    same = group_by_stack({r: rank(r, IN_ALL_REDUCE) for r in range(4)})
    assert stack_outliers(same, range(4)) == []
    # Only members count: rank 5 elsewhere is no outlier of group {0..3}; a member without a stack is none.
    mixed = group_by_stack({**{r: rank(r, IN_ALL_REDUCE) for r in range(3)}, 5: rank(5, ASLEEP),
                            3: RankStacks(rank=3, source=StackSource.PY_SPY, unavailable=Unavailable.PTRACE_REFUSED,
                                          detail="Permission Denied")})
    assert stack_outliers(mixed, range(4)) == []
    assert mixed.without_stack == {3: "py-spy: ptrace_refused (Permission Denied)"}
    assert stack_outliers(mixed, [0]) == []


def test_best_stacks_prefers_the_collector_then_py_spy_and_keeps_why_there_is_none() -> None:
    records = [rank(0, ASLEEP, source=StackSource.FR_CALLSITE), rank(0, IN_ALL_REDUCE, source=StackSource.TORCH_DEBUG),
               rank(0, IN_ALL_REDUCE, source=StackSource.COLLECTOR),
               RankStacks(rank=1, source=StackSource.PY_SPY, unavailable=Unavailable.PROCESS_GONE),
               rank(2, ASLEEP, source=StackSource.FR_CALLSITE),
               RankStacks(rank=2, source=StackSource.PY_SPY, unavailable=Unavailable.PTRACE_REFUSED)]
    best = best_stacks(records)
    assert {r: s.source for r, s in best.items()} == {0: StackSource.COLLECTOR, 1: StackSource.PY_SPY,
                                                     2: StackSource.FR_CALLSITE}
    assert best[1].unavailable is Unavailable.PROCESS_GONE
    assert candidate_stack(best[1]) is None


def test_markdown_rendering_escapes_what_the_job_controls() -> None:
    evil = "step](http://evil.example)<script>`x`\n# heading"
    hostile = parse_stacks_record(json.dumps({"rank": 0, "source": "collector", "threads": [
        {"name": "MainThread", "frames": [{"file": "/job/[x](y).py", "line": 1, "function": evil}]}]}).encode())
    grouping = group_by_stack({0: hostile, 1: rank(1, IN_ALL_REDUCE)})
    markdown = stack_groups_markdown(grouping)
    assert "<script>" not in markdown and "](http" not in markdown and "\n#" not in markdown
    assert "\\<script\\>" in markdown and "\\`" in markdown
    assert markdown.count("\n") == 1  # one list item per group, whatever the names hold


def test_long_renderings_are_cut() -> None:
    stacks = {r: rank(r, [f("/job/t.py", r + 1, "f")]) for r in range(40)}
    stacks[40] = RankStacks(rank=40, source=StackSource.PY_SPY, unavailable=Unavailable.TIMED_OUT)
    lines = render_stack_groups(group_by_stack(stacks), limit=5)
    assert lines[5] == "... and 35 more stack groups"
    assert lines[6] == "rank 40: no stack (py-spy: timed_out)"
    assert StackGrouping(groups=[]).group_of(0) is None
