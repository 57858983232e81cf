"""``load_telemetry``: several files, mixed formats, unreadable files named, odd bytes counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from denpex.hardware import RejectReason, SignalKind, TelemetryFileError, load_telemetry

XID = "2026-11-29T18:45:02+0000 gpu-node-002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
JSON_XID = '{"v": 1, "type": "xid", "host": "gpu-node-003", "time": "2026-11-29T18:44:00Z", "code": 13}\n'


def test_files_are_merged_and_sorted_by_time(tmp_path: Path) -> None:
    (tmp_path / "node2.log").write_text(XID + "-- Boot 1 --\n")
    (tmp_path / "node3.jsonl").write_text(JSON_XID + "{broken\n")
    result = load_telemetry([tmp_path / "node2.log", tmp_path / "node3.jsonl"])
    assert [(e.kind, e.code) for e in result.events] == [(SignalKind.XID, 13), (SignalKind.XID, 79)]
    assert result.rejects == {RejectReason.NO_PREFIX: 1, RejectReason.BAD_JSON: 1}
    assert result.hosts == ["gpu-node-002", "gpu-node-003"] and result.lines_read == 4
    assert result.sources == [str(tmp_path / "node2.log"), str(tmp_path / "node3.jsonl")]


def test_crlf_and_undecodable_bytes_are_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "k.log"
    path.write_bytes(XID.replace("\n", "\r\n").encode() + b"\xff\xfe garbage \x00\r\n")
    result = load_telemetry([path])
    assert [e.code for e in result.events] == [79] and result.rejects == {RejectReason.NO_PREFIX: 1}


@pytest.mark.parametrize("first", [pytest.param(XID, id="kernel-line"), pytest.param(JSON_XID, id="collector-record")])
def test_a_byte_order_mark_does_not_cost_the_first_line(tmp_path: Path, first: str) -> None:
    """Files saved by some editors start with a UTF-8 BOM; the first line may be the only Xid."""
    path = tmp_path / "k.log"
    path.write_bytes(b"\xef\xbb\xbf" + first.encode())
    result = load_telemetry([path])
    assert [e.kind for e in result.events] == [SignalKind.XID] and result.rejected == 0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda p: p / "missing.log", "missing.log: cannot read telemetry file", id="missing"),
        pytest.param(lambda p: p, "is a folder", id="folder"),
    ],
)
def test_unreadable_files_are_named(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(TelemetryFileError, match=message):
        load_telemetry([make(tmp_path)])
