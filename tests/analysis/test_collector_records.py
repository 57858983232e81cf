"""Triage reads the collector's records when there is no manifest; bad records never break it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from denpex.analysis.triage import triage_path
from denpex.collector import DumpRecord, DumpTrigger, record_path, write_atomic
from denpex.evidence.manifest import ProcessGroupSpec
from dumps import T0, dump, history, write

WHEN = datetime.fromtimestamp(T0 / 1e9, UTC)


def _record(folder: Path, rank: int, **kw: object) -> None:
    fields: dict[str, object] = {"rank": rank, "host": f"node-{rank}", "pid": 10 + rank,
                                 "dumped_at": WHEN, "trigger": DumpTrigger.REQUEST, "reason": "r",
                                 "files": [f"rank_{rank}.pkl"], "dump_seconds": 0.01} | kw
    write_atomic(record_path(folder, rank), DumpRecord.model_validate(fields).model_dump_json().encode())


def test_records_give_hosts_groups_and_world_size(tmp_path: Path) -> None:
    # Rank 3 left no dump at all: only the records' world size says the job had 4 ranks.
    write(tmp_path, {r: dump(history("0", 5, pending=1)) for r in (0, 1)} | {2: dump(history("0", 5))})
    groups = {"0": ProcessGroupSpec(desc="default_pg", ranks=(0, 1, 2, 3))}
    for rank in range(3):
        _record(tmp_path, rank, world_size=4, process_groups=groups)
    write_atomic(record_path(tmp_path, 7), b"{broken")
    result = triage_path(tmp_path)
    assert result.world_size == 4 and result.missing_ranks == [3]
    assert {c.rank: c.host for c in result.candidates} == {2: "node-2", 3: None}
    notes = " ".join(result.notes)
    assert "rank_7.record.json: not a usable collector record" in notes


def test_records_beyond_the_world_size_are_not_used(tmp_path: Path) -> None:
    write(tmp_path, {r: dump(history("0", 5)) for r in range(2)})
    _record(tmp_path, 5)
    result = triage_path(tmp_path, world_size=2)
    assert result.verdict.value == "no_hang"
    assert any("were not used" in n for n in result.notes)
