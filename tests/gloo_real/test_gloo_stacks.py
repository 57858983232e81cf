"""Stacks from real Gloo jobs (issue 19): the collector's own, torch's debug server's, FR's call
sites, and py-spy's for a rank whose interpreter is wedged.

Job 1, 4 ranks (testkit.generators.stacks_worker): ranks 0, 1, 3 wait in an all_reduce that
rank 2 never joins, since it sleeps inside ``sleep_in_data_loader``; every rank runs the
product's HangDumper, and torch's debug server writes ``stacks_<time>.txt`` every second.
Job 2, 2 ranks: rank 0 waits in the all_reduce, rank 1 holds the GIL in a backtracking regex
inside ``wedge_in_regex``; its dumper can never run, and its py-spy sidecar reads it from outside.
"""

from __future__ import annotations

import inspect
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from denpex.analysis.stack_groups import best_stacks, candidate_stack, group_by_stack, stack_outliers
from denpex.collector import read_dump_records
from denpex.collector.layout import stacks_path
from denpex.evidence.safe_pickle import safe_loads
from denpex.evidence.stacks import (
    StackSource,
    debug_stacks_files,
    fr_callsite_stacks,
    nearest_debug_stacks,
    read_collected_stacks,
    read_debug_stacks,
)
from testkit.generators import stacks_worker
from testkit.generators.stacks_job import StacksJob

pytestmark = [pytest.mark.timeout(300)]

WORKER_FILE = Path(stacks_worker.__file__).name


def line_of(function: Callable[..., object], statement: str) -> int:
    """The line number of ``statement`` inside ``function``'s source."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, text in enumerate(lines) if statement in text)


ALL_REDUCE_LINE = line_of(stacks_worker.step, "dist.all_reduce(tensor)")
SLEEP_LINE = line_of(stacks_worker.sleep_in_data_loader, "time.sleep(seconds)")
REGEX_LINE = line_of(stacks_worker.wedge_in_regex, "re.match(")


@pytest.fixture(scope="module")
def sleeper_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Job 1's files, once every rank dumped and the debug server wrote past the dumps.

    ``hang/`` is the dump folder as the ranks left it; ``debug/`` every file the debug server wrote
    until the job was killed (the first ones from before the hang); ``debug-hang/`` the one the
    product's rule picks beside the dumps (nearest rank 2's dump)."""
    work = tmp_path_factory.mktemp("sleeper")

    def dumped_at() -> datetime:
        return read_dump_records(work / "hang")[2].dumped_at

    # Dumps at 6 s, the collective's timeout at 20 s: the files nearest the dumps show the hang.
    with StacksJob(work, ["collective", "collective", "sleep", "collective"], timeout_s=20, trigger_fraction=0.3,
                   debug_server=True) as job:
        job.wait_for(lambda: len(job.records()) == 4, timeout_s=150, what="every rank's dump")
        job.snapshot(work / "hang")
        # A file on each side of the dump, so that the nearest one is settled.
        job.wait_for(lambda: any(f.taken_at > dumped_at() + timedelta(seconds=2)
                                 for f in debug_stacks_files(work / "debug")),
                     timeout_s=60, what="a debug-server file written after the dumps")
    chosen = nearest_debug_stacks(debug_stacks_files(work / "debug"), dumped_at())
    assert chosen is not None
    (work / "debug-hang").mkdir()
    shutil.copy(work / "debug" / chosen.name, work / "debug-hang" / chosen.name)
    yield work
    shutil.rmtree(work, ignore_errors=True)


def test_collector_stacks_group_the_peers_and_name_the_sleeper(sleeper_job: Path) -> None:
    found = read_collected_stacks(sleeper_job / "hang")
    assert found.refused == {}
    assert sorted(r.rank for r in found.records) == [0, 1, 2, 3]
    assert all(r.source is StackSource.COLLECTOR for r in found.records)
    grouping = group_by_stack(best_stacks(found.records))
    assert [g.ranks for g in grouping.groups] == [[0, 1, 3], [2]]
    peers, sleeper = grouping.groups
    assert peers.collective == "all_reduce"
    call_site = peers.frames[1]
    assert (Path(call_site.file).name, call_site.line, call_site.function) == (WORKER_FILE, ALL_REDUCE_LINE, "step")
    assert peers.summary == f"`all_reduce` from `{WORKER_FILE}:{ALL_REDUCE_LINE} step()`"
    assert sleeper.summary == f"in `{WORKER_FILE}:{SLEEP_LINE} sleep_in_data_loader()`"

    [outlier] = stack_outliers(grouping, [0, 1, 2, 3])
    assert outlier.rank == 2 and outlier.majority.ranks == [0, 1, 3]
    stack = candidate_stack(best_stacks(found.records)[2])
    assert stack is not None and stack.source is StackSource.COLLECTOR and stack.thread == "MainThread"
    assert (stack.frames[0].function, stack.frames[0].line) == ("sleep_in_data_loader", SLEEP_LINE)


def test_collector_stacks_are_taken_at_the_dump(sleeper_job: Path) -> None:
    records = read_dump_records(sleeper_job / "hang")
    for rank, record in records.items():
        stacks = read_collected_stacks(sleeper_job / "hang").records[rank]
        assert stacks.taken_at == record.dumped_at and stacks.pid == record.pid
        assert stacks.thread(f"denpex-hang-dumper-{rank}") is not None  # the dumper's own thread, listed
    assert stacks_path(sleeper_job / "hang", 2).name == "rank_2.stacks.json"


def test_fr_call_sites_of_the_stuck_all_reduce(sleeper_job: Path) -> None:
    dumps = {r: safe_loads((sleeper_job / "hang" / f"rank_{r}.pkl").read_bytes()) for r in range(4)}
    stuck = dumps[0]["entries"][-1]
    assert stuck["retired"] is False
    group, seq = stuck["process_group"][0], stuck["collective_seq_id"]
    for rank in (0, 1, 3):
        stacks = fr_callsite_stacks(dumps[rank], rank=rank, group_name=group, seq_id=seq)
        assert stacks is not None and stacks.source is StackSource.FR_CALLSITE
        stack = candidate_stack(stacks)
        assert stack is not None and stack.summary == f"`all_reduce` from `{WORKER_FILE}:{ALL_REDUCE_LINE} step()`"
    assert fr_callsite_stacks(dumps[2], rank=2, group_name=group, seq_id=seq) is None  # it never called it


def test_debug_server_stacks_files_are_read_beside_the_dumps(sleeper_job: Path) -> None:
    # The file nearest the dump (the product's rule, applied by the fixture) shows the hang.
    [hang_file] = debug_stacks_files(sleeper_job / "debug-hang")
    assert len(debug_stacks_files(sleeper_job / "debug")) > 1
    ranks = read_debug_stacks(sleeper_job / "debug-hang", hang_file).ranks
    assert all(r.source is StackSource.TORCH_DEBUG for r in ranks.values())
    grouping = group_by_stack(ranks)
    assert [g.ranks for g in grouping.groups] == [[0, 1, 3], [2]]
    assert grouping.groups[1].summary == f"in `{WORKER_FILE}:{SLEEP_LINE} sleep_in_data_loader()`"
    assert [o.rank for o in stack_outliers(grouping, range(4))] == [2]


@pytest.fixture(scope="module")
def wedged_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Job 2's files, once rank 0 dumped and rank 1's sidecar wrote py-spy's stacks."""
    work = tmp_path_factory.mktemp("wedged")
    with StacksJob(work, ["collective", "regex"], timeout_s=15, trigger_fraction=0.3, sidecar_deadline_s=2.0) as job:
        job.wait_for(lambda: stacks_path(work / "collected", 1, StackSource.PY_SPY).exists()
                     and stacks_path(work / "collected", 0).exists(), timeout_s=150, what="rank 1's py-spy stacks")
        job.snapshot(work / "hang")
        (work / "rank-1-alive").write_text(str(job.procs[1].poll() is None))
    yield work
    shutil.rmtree(work, ignore_errors=True)


def test_a_rank_wedged_in_c_code_gets_its_stack_from_py_spy(wedged_job: Path) -> None:
    collected = wedged_job / "hang"
    # Its own dumper wrote nothing: no dump, no record, no stacks of its own.
    assert not (collected / "rank_1.pkl").exists()
    assert 1 not in read_dump_records(collected)
    assert not stacks_path(collected, 1).exists()
    assert (wedged_job / "rank-1-alive").read_text() == "True"

    found = read_collected_stacks(collected)
    assert found.refused == {}
    best = best_stacks(found.records)
    assert {r: s.source for r, s in best.items()} == {0: StackSource.COLLECTOR, 1: StackSource.PY_SPY}
    stack = candidate_stack(best[1])
    assert stack is not None and stack.thread == "MainThread"
    assert stack.summary == f"`re.match` in `{WORKER_FILE}:{REGEX_LINE} wedge_in_regex()`"
    main = best[1].thread("MainThread")
    assert main is not None and main.holds_gil is True

    grouping = group_by_stack(best)
    [outlier] = stack_outliers(grouping, [0, 1])
    assert outlier.rank == 1 and outlier.majority.collective == "all_reduce"


# --- The stacks in the triage itself: ``denpex triage --format json`` on the real jobs' folders ---

def as_of(folder: Path) -> datetime:
    """Half a minute after the last dump."""
    return max(r.dumped_at for r in read_dump_records(folder).values()) + timedelta(seconds=30)


def triage(folder: Path, *args: str) -> str:
    """The real command, as an operator runs it half a minute after the dumps (they come at 30% of
    the collective's timeout, when the op is still young at the ranks' own dump time)."""
    done = subprocess.run([sys.executable, "-m", "denpex", "triage", str(folder), "--as-of", as_of(folder).isoformat(),
                           *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def triage_json(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(triage(folder, "--format", "json"))
    return data


def frame_at(frames: list[dict[str, Any]], function: str) -> tuple[str, int, str]:
    [frame] = [f for f in frames if f["function"] == function]
    return Path(frame["file"]).name, frame["line"], frame["function"]


def test_triage_json_gives_the_sleeper_its_collector_stack_and_groups_the_peers(sleeper_job: Path) -> None:
    report = triage_json(sleeper_job / "hang")
    [candidate] = report["candidates"]
    assert candidate["rank"] == 2 and candidate["kind"] == "not_entered"
    stack = candidate["stack"]
    assert stack["source"] == "collector" and stack["thread"] == "MainThread"
    assert frame_at(stack["frames"], "sleep_in_data_loader") == (WORKER_FILE, SLEEP_LINE, "sleep_in_data_loader")
    assert any(f["function"] == "sleep_in_data_loader" for f in stack["all_frames"])
    assert [g["ranks"] for g in report["stack_groups"]] == [[0, 1, 3], [2]]
    peers = report["stack_groups"][0]
    assert peers["collective"] == "all_reduce"
    assert frame_at(peers["frames"], "step") == (WORKER_FILE, ALL_REDUCE_LINE, "step")
    assert any("differs from the majority" in r and "ranks 0, 1, 3" in r for r in candidate["reasons"])

    # The same verdict, candidates and kinds as without any stacks: a stack never overrides FR.
    bare = sleeper_job / "hang-without-stacks"
    shutil.copytree(sleeper_job / "hang", bare, ignore=shutil.ignore_patterns("*.stacks.json"))
    without = triage_json(bare)
    assert without["stack_groups"] != report["stack_groups"]
    assert (without["verdict"], [(c["rank"], c["kind"]) for c in without["candidates"]]) == (
        report["verdict"], [(c["rank"], c["kind"]) for c in report["candidates"]])


def test_triage_text_shows_the_sleeper_beside_the_majority(sleeper_job: Path) -> None:
    text = triage(sleeper_job / "hang")
    assert f"{WORKER_FILE}:{SLEEP_LINE} sleep_in_data_loader()" in text
    assert f"ranks 0, 1, 3: `all_reduce` from `{WORKER_FILE}:{ALL_REDUCE_LINE} step()`" in text


def test_triage_reads_torch_debug_servers_stacks_file_beside_the_dumps(sleeper_job: Path) -> None:
    # The job's dumps without Denpex's stacks files, and every file the debug server wrote beside them
    # (some from before the hang): the triage reads the one its rule picks, nearest its as-of.
    folder = sleeper_job / "hang-with-debug-file"
    shutil.copytree(sleeper_job / "hang", folder, ignore=shutil.ignore_patterns("*.stacks.json"))
    for file in debug_stacks_files(sleeper_job / "debug"):
        shutil.copy(sleeper_job / "debug" / file.name, folder / file.name)
    chosen = nearest_debug_stacks(debug_stacks_files(folder), as_of(folder))
    assert chosen is not None
    report = triage_json(folder)
    assert [s["path"] for s in report["skipped_files"]] == []  # not mistaken for a dump
    [candidate] = report["candidates"]
    assert candidate["rank"] == 2 and candidate["stack"]["source"] == "torch-debug"
    assert frame_at(candidate["stack"]["frames"], "sleep_in_data_loader")[1] == SLEEP_LINE
    assert [g["ranks"] for g in report["stack_groups"]] == [[0, 1, 3], [2]]
    assert report["stack_groups"][0]["sources"] == ["torch-debug"]
    assert any(chosen.name in note for note in report["notes"])


def test_triage_json_takes_the_wedged_ranks_stack_from_py_spy(wedged_job: Path) -> None:
    collected = wedged_job / "hang"
    assert not (collected / "rank_1.pkl").exists() and not stacks_path(collected, 1).exists()
    report = triage_json(collected)
    [candidate] = report["candidates"]
    assert candidate["rank"] == 1
    stack = candidate["stack"]
    assert stack["source"] == "py-spy" and stack["thread"] == "MainThread"
    assert frame_at(stack["frames"], "wedge_in_regex") == (WORKER_FILE, REGEX_LINE, "wedge_in_regex")
    assert [g["ranks"] for g in report["stack_groups"]] == [[0], [1]]
    assert report["stack_groups"][0]["collective"] == "all_reduce"
