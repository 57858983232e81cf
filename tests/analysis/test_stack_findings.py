"""Stack findings for a triage: a folder's stack evidence (collector files, the debug server's
file nearest the incident) turned into stack groups, candidate stacks and outliers, and their
text and markdown; hostile files leave the findings from the rest unchanged."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

from denpex.analysis.stack_findings import render_stack_findings, stack_findings, stack_findings_markdown
from denpex.evidence.stacks import StackSource, read_stack_evidence, stacks_file_name

FIXTURES = Path(__file__).parent.parent / "fixtures" / "stacks"
SAMPLE = "stacks_20261202_190811.txt"
AT = datetime(2026, 12, 2, 19, 8, 12, tzinfo=UTC)


def folder_with_debug_sample(tmp_path: Path) -> Path:
    shutil.copy(FIXTURES / SAMPLE, tmp_path / SAMPLE)
    (tmp_path / "stacks_20261202_100000.txt").write_text("=== Rank 0: old ===\n")  # hours before: not used
    return tmp_path


def test_a_folder_with_the_debug_servers_file_gives_groups_stacks_and_the_outlier(tmp_path: Path) -> None:
    evidence = read_stack_evidence(folder_with_debug_sample(tmp_path), at=AT)
    assert evidence.debug_file == SAMPLE and evidence.refused == {}
    found = stack_findings(evidence.records, stuck_groups={"0": [0, 1, 2, 3]}, candidates=[2])
    assert [g.ranks for g in found.stack_groups] == [[0, 1, 3], [2]]
    assert list(found.candidate_stacks) == [2]
    assert found.candidate_stacks[2].source is StackSource.TORCH_DEBUG
    assert found.outlier_reasons(2)[0].startswith("in group 0, its stack (in `job.py:7 sleep_in_loader()`)")
    assert found.outlier_reasons(0) == []
    as_json = json.loads(found.model_dump_json())
    assert as_json["stack_groups"][0]["frames"][1] == {"file": "/tmp/dbg/job.py", "line": 10, "function": "step"}
    assert as_json["candidate_stacks"]["2"]["frames"][0]["function"] == "sleep_in_loader"

    text = render_stack_findings(found)
    assert text[1] == "  ranks 0, 1, 3: `all_reduce` from `job.py:10 step()`"
    assert "  stands apart in group 0:" in text
    markdown = stack_findings_markdown(found)
    assert markdown.startswith("### Stacks\n\n```text\n") and markdown.rstrip().endswith("```")


def test_collector_files_are_preferred_and_hostile_ones_change_nothing_else(tmp_path: Path) -> None:
    folder = folder_with_debug_sample(tmp_path)
    baseline = stack_findings(read_stack_evidence(folder, at=AT).records, stuck_groups={"0": [0, 1, 2, 3]},
                              candidates=[2])
    collector = folder / "collector"
    collector.mkdir()
    (collector / stacks_file_name(1)).write_bytes(b"[" * 50_000)
    (collector / stacks_file_name(3)).write_bytes(b"{" + b" " * (5 << 20) + b"}")
    (collector / stacks_file_name(0)).write_text(json.dumps({"rank": 0, "source": "collector", "threads": [
        {"name": "MainThread", "frames": [{"file": "/job/x.py", "line": "1", "function": "f"}]}]}))
    evidence = read_stack_evidence(folder, at=AT)
    assert sorted(evidence.refused) == ["rank_0.stacks.json", "rank_1.stacks.json", "rank_3.stacks.json"]
    found = stack_findings(evidence.records, stuck_groups={"0": [0, 1, 2, 3]}, candidates=[2])
    assert found == baseline

    (collector / stacks_file_name(2)).write_text(json.dumps({"rank": 2, "source": "collector", "threads": [
        {"name": "MainThread", "frames": [{"file": "/job/data.py", "line": 45, "function": "next_batch"}]}]}))
    preferred = stack_findings(read_stack_evidence(folder, at=AT).records, stuck_groups={}, candidates=[2])
    assert preferred.candidate_stacks[2].source is StackSource.COLLECTOR
    assert preferred.candidate_stacks[2].summary == "in `data.py:45 next_batch()`"


def test_no_stack_evidence_gives_empty_findings(tmp_path: Path) -> None:
    evidence = read_stack_evidence(tmp_path, at=None)
    found = stack_findings(evidence.records, stuck_groups={"0": [0, 1]}, candidates=[0])
    assert found.stack_groups == [] and found.candidate_stacks == {} and found.outliers == {}
    assert render_stack_findings(found) == [] and stack_findings_markdown(found) == ""
