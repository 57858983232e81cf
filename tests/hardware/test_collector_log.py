"""Collector JSON lines: NVLink deltas between snapshots, remapped rows, Xid, gaps and bad records."""

from __future__ import annotations

import json

import pytest

from denpex.hardware import RejectReason, Severity, SignalKind
from denpex.hardware.collector_log import parse_collector_lines

GPU = {"index": 0, "uuid": "GPU-aaaa", "pci_bus_id": "00000000:3B:00.0"}


def rec(type_: str, time: str = "2026-11-29T18:40:00Z", **fields: object) -> str:
    return json.dumps({"v": 1, "type": type_, "host": "gpu-node-002", "time": time, **fields})


def nvlink(snapshot: int, time: str, active: bool = True, **counters: int) -> str:
    return rec("nvlink", time, snapshot=snapshot, gpu=GPU, link=3, active=active, counters=counters)


def rows(snapshot: int, time: str, unc: int = 0, pending: bool = False, failure: bool = False) -> str:
    return rec("remapped_rows", time, snapshot=snapshot, gpu=GPU, correctable=0, uncorrectable=unc,
               pending=pending, failure=failure)


T0, T1 = "2026-11-29T18:40:00Z", "2026-11-29T18:45:00Z"


@pytest.mark.parametrize(
    ("lines", "severity", "detail_part"),
    [
        pytest.param([nvlink(0, T0, dl_recovery=2), nvlink(1, T1, dl_recovery=7)], Severity.NON_FATAL,
                     "dl_recovery +5 (2 -> 7)", id="recovery-rose"),
        pytest.param([nvlink(0, T0, dl_replay=10, crc_flit=0), nvlink(1, T1, dl_replay=11, crc_flit=3)],
                     Severity.CORRECTABLE, "dl_replay +1 (10 -> 11), crc_flit +3 (0 -> 3)", id="replay-and-crc-rose"),
        pytest.param([nvlink(0, T0, active=True), nvlink(1, T1, active=False)], Severity.FATAL,
                     "went down", id="link-went-down"),
        pytest.param([nvlink(1, T1, dl_recovery=7), nvlink(0, T0, dl_recovery=2)], Severity.NON_FATAL,
                     "+5", id="out-of-order-lines"),
    ],
)
def test_nvlink_counters_become_events_only_when_they_rise(lines: list[str], severity: Severity, detail_part: str) -> None:
    [event] = parse_collector_lines(lines).events
    assert (event.kind, event.severity, event.link) == (SignalKind.NVLINK, severity, 3)
    assert event.gpu is not None and event.gpu.pci_bus_id == "0000:3b:00.0"
    assert detail_part in event.detail


@pytest.mark.parametrize(
    "lines",
    [
        pytest.param([nvlink(0, T0, dl_recovery=2), nvlink(1, T1, dl_recovery=2)], id="flat"),
        pytest.param([nvlink(0, T0, dl_recovery=9), nvlink(1, T1, dl_recovery=0)], id="counters-reset"),
        pytest.param([nvlink(0, T0, dl_recovery=2)], id="single-snapshot"),
    ],
)
def test_no_nvlink_event_without_a_rise(lines: list[str]) -> None:
    assert parse_collector_lines(lines).events == []


@pytest.mark.parametrize(
    ("before", "after", "event_part", "gap_part"),
    [
        pytest.param(9, 0, None, "dl_recovery went back from 9 to 0", id="reset-to-zero"),
        pytest.param(100, 5, "dl_recovery reset (100 -> 5): at least +5", None, id="reset-then-rose"),
    ],
)
def test_counters_that_go_back_are_never_read_as_healthy(
    before: int, after: int, event_part: str | None, gap_part: str | None
) -> None:
    """A counter that went down was reset (GPU reset, driver reload): its change is unknown, or at least its new value."""
    result = parse_collector_lines([nvlink(0, T0, dl_recovery=before), nvlink(1, T1, dl_recovery=after)])
    assert [event_part in e.detail for e in result.events] == ([True] if event_part else [])
    gaps = [(u.what, u.link, u.gpu.pci_bus_id if u.gpu else None) for u in result.unavailable if gap_part and gap_part in u.detail]
    assert gaps == ([("nvlink_dl_recovery", 3, "0000:3b:00.0")] if gap_part else [])


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        pytest.param([rows(0, T0, failure=True), rows(1, T1, failure=True)], [Severity.FATAL], id="failure-once"),
        pytest.param([rows(0, T0, unc=1), rows(1, T1, unc=3)], [Severity.NON_FATAL], id="uncorrectable-rose"),
        pytest.param([rows(0, T0), rows(1, T1, pending=True)], [Severity.CORRECTABLE], id="pending-appeared"),
        pytest.param([rows(0, T0, unc=2), rows(1, T1, unc=2)], [], id="steady"),
    ],
)
def test_remapped_rows(lines: list[str], expected: list[Severity]) -> None:
    events = parse_collector_lines(lines).events
    assert [e.severity for e in events] == expected
    assert all(e.kind is SignalKind.ROW_REMAP for e in events)


def test_xid_identity_and_gaps_are_read() -> None:
    result = parse_collector_lines([
        rec("session", phase="start", duration_s=30),
        rec("gpu", gpu=GPU, name="NVIDIA H100", pcie_path=["0000:00:01.0", "0000:01:00.0"]),
        rec("xid", T1, gpu=GPU, code=79),
        rec("not_available", what="nvlink", detail="Not Supported", gpu=GPU),
    ])
    [xid] = result.events
    assert (xid.kind, xid.code, xid.severity) == (SignalKind.XID, 79, Severity.FATAL)
    [gpu] = result.gpus
    assert gpu.pcie_path == ("0000:00:01.0", "0000:01:00.0") and gpu.gpu.uuid == "GPU-aaaa"
    [gap] = result.unavailable
    assert (gap.what, gap.detail) == ("nvlink", "Not Supported")
    assert result.hosts == ["gpu-node-002"] and result.rejected == 0


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        pytest.param("{not json", RejectReason.BAD_JSON, id="bad-json"),
        pytest.param('{"v": ' + "9" * 5000 + "}", RejectReason.BAD_JSON, id="integer-past-digit-limit"),
        pytest.param('{"v": 1, "type": "gpu_temperature", "host": "h", "time": "2026-11-29T18:40:00Z"}',
                     RejectReason.UNKNOWN_RECORD, id="unknown-type"),
        pytest.param('{"v": 2, "type": "xid", "host": "h", "time": "2026-11-29T18:40:00Z", "code": 79}',
                     RejectReason.UNSUPPORTED_VERSION, id="future-version"),
        pytest.param('{"v": 1, "type": "xid", "host": "h", "time": "2026-11-29T18:40:00", "code": 79}',
                     RejectReason.INVALID_RECORD, id="time-without-offset"),
        pytest.param('{"v": 1, "type": "xid", "host": "h", "time": "0001-01-01T00:00:00+01:00", "code": 79}',
                     RejectReason.INVALID_RECORD, id="time-before-year-1-in-utc"),
        pytest.param('{"v": 1, "type": "xid", "host": "h", "time": "2026-11-29T18:40:00Z", "code": -1}',
                     RejectReason.INVALID_RECORD, id="negative-code"),
        pytest.param('{"v": 1, "type": "xid", "host": "h", "time": "2026-11-29T18:40:00Z", "code": 79, "extra": 1}',
                     RejectReason.INVALID_RECORD, id="unknown-field"),
        pytest.param('{"v": 1, "type": "gpu", "host": "h", "time": "2026-11-29T18:40:00Z", "gpu": {"pci_bus_id": "x"}}',
                     RejectReason.INVALID_RECORD, id="bad-pci-address"),
    ],
)
def test_bad_records_are_counted(line: str, reason: RejectReason) -> None:
    result = parse_collector_lines([line])
    assert result.events == [] and result.rejects == {reason: 1}
