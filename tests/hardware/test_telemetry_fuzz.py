"""Garbage in: the parsers never crash, and every line is accounted for (event, fold or reject)."""

from __future__ import annotations

import json
from datetime import datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from denpex.hardware import RejectReason, parse_telemetry_lines
from denpex.hardware.collector_log import parse_collector_lines
from denpex.hardware.kernel_log import parse_kernel_log

P = "2026-11-29T18:45:02+0000 gpu-node-002 kernel: "
REAL_LINES = [
    P + "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.",
    P + "NVRM: GPU at PCI:0000:3b:00: GPU-5d1e7a2c-1111-2222-3333-444455556666",
    P + "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)",
    P + "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Transaction Layer, (Receiver ID)",
    P + "nvidia 0000:3b:00.0:   device [10de:2330] error status/mask=00004000/00000000",
    P + "pcieport 0000:00:01.0: AER: Multiple Uncorrectable (Non-Fatal) error message received from 0000:73:00.1",
    P + "Memory cgroup out of memory: Killed process 5151 (pt_main_thread) total-vm:1000kB, anon-rss:900kB",
    P + "oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=4242,uid=0",
    P + "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    # A firmware-first (APEI GHES) PCIe record and the kernel's AER decode after it.
    P + "{1}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 1",
    P + "{1}[Hardware Error]: event severity: recoverable",
    P + "{1}[Hardware Error]:  Error 0, type: recoverable",
    P + "{1}[Hardware Error]:   section_type: PCIe error",
    P + "{1}[Hardware Error]:   section_type: memory error",
    P + "{1}[Hardware Error]:   device_id: 0000:3b:00.0",
    P + "{1}[Hardware Error]:   vendor_id: 0x10de, device_id: 0x2330",
    P + "pcieport 0000:3a:00.0: AER: aer_status: 0x00004000, aer_mask: 0x00000000",
    P + "pcieport 0000:3a:00.0: AER: aer_layer=Transaction Layer, aer_agent=Requester ID",
    '{"v": 1, "type": "xid", "host": "h", "time": "2026-11-29T18:40:00Z", "code": 79}',
]
# Hypothesis's default number of examples per test: 300 made the four fuzz tests take minutes of
# one core under the suite's own load (one hit its 120 s limit in the middle of a draw).
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def accounted(lines: list[str]) -> None:
    result = parse_kernel_log(lines)
    produced = len(result.events) + len(result.gpus) + result.continuation_lines
    assert produced + result.rejected == result.lines_read


@FUZZ
@given(st.lists(st.text(max_size=300), max_size=30))
def test_arbitrary_text_is_counted_never_fatal(lines: list[str]) -> None:
    accounted(lines)
    result = parse_telemetry_lines(lines)
    assert result.rejected <= result.lines_read


@st.composite
def mutated_real_lines(draw: st.DrawFn) -> list[str]:
    out = []
    for _ in range(draw(st.integers(1, 12))):
        line = draw(st.sampled_from(REAL_LINES))
        for _ in range(draw(st.integers(0, 4))):
            at = draw(st.integers(0, len(line)))
            op = draw(st.sampled_from(["insert", "delete", "truncate"]))
            if op == "insert":
                line = line[:at] + draw(st.text(max_size=8)) + line[at:]
            elif op == "delete":
                line = line[:at] + line[at + draw(st.integers(1, 6)):]
            else:
                line = line[:at]
        out.append(line)
    return out


@FUZZ
@given(mutated_real_lines())
def test_mutated_real_lines_are_counted_never_fatal(lines: list[str]) -> None:
    accounted([line for line in lines if not line.lstrip().startswith("{")])
    result = parse_telemetry_lines(lines)
    assert result.rejected <= result.lines_read


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@st.composite
def collector_like_records(draw: st.DrawFn) -> str:
    record = draw(st.dictionaries(st.sampled_from(
        ["v", "type", "host", "time", "gpu", "link", "counters", "snapshot", "code", "what", "detail", "active",
         "correctable", "uncorrectable", "pending", "failure", "pcie_path", "phase"]), json_values, max_size=10))
    if draw(st.booleans()):
        record["type"] = draw(st.sampled_from(["session", "gpu", "nvlink", "remapped_rows", "xid", "not_available"]))
        record["v"] = 1
    return json.dumps(record)


@FUZZ
@given(st.lists(collector_like_records(), max_size=20))
def test_collector_like_garbage_is_counted_never_fatal(lines: list[str]) -> None:
    result = parse_collector_lines(lines)
    assert result.rejected <= result.lines_read == len(lines)


def test_hostile_lines_stay_cheap() -> None:
    """Lines built to make backtracking regexes slow are parsed in linear-ish time (a DoS guard)."""
    import time

    shapes = [
        P + "pcieport 0000:00:01.0: AER: " + "error " * 1300,
        P + "pcieport 0000:00:01.0: AER: error" + " received" * 900,
        P + "NVRM: Xid " + ": 1x" * 2000,
        P + "nvidia 0000:3b:00.0: PCIe Bus Error: severity=" + "a," * 4000,
        P + "Out of memory: " + "Kill process 1 (" * 400,
        P + "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 " + "(" * 4000,
        P + "{1}[Hardware Error]: " + "section_type: " * 500,
    ]
    started = time.process_time()  # this process's CPU: what the parse costs, whatever else runs
    parse_kernel_log([line[:8192] for line in shapes] * 40)
    # 200 lines; the nested-lazy AER pattern this replaced took about 0.3 s per line.
    assert time.process_time() - started < 5.0


# The edges of the calendar are drawn on purpose: that is where an offset leaves it.
CALENDAR_TIMES = st.one_of(st.datetimes(max_value=datetime(1, 1, 2)), st.datetimes(min_value=datetime(9999, 12, 31)),
                           st.datetimes())


@FUZZ
@given(CALENDAR_TIMES, st.integers(-(24 * 60 - 1), 24 * 60 - 1), st.sampled_from(["", ":"]))
def test_any_calendar_time_with_any_offset_is_an_event_or_a_counted_bad_time(
    when: datetime, offset_min: int, separator: str
) -> None:
    """Offsets can push a valid local time past year 1 or 9999 in UTC: counted, never an OverflowError."""
    hours, minutes = divmod(abs(offset_min), 60)
    sign = "-" if offset_min < 0 else "+"
    local = f"{when.year:04d}-{when:%m-%dT%H:%M:%S}"
    line = f"{local}{sign}{hours:02d}{separator}{minutes:02d} h kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU fell off."
    result = parse_kernel_log([line])
    assert len(result.events) + result.rejects.get(RejectReason.BAD_TIME, 0) == 1
    record = {"v": 1, "type": "xid", "host": "h", "time": f"{local}{sign}{hours:02d}:{minutes:02d}", "code": 79}
    collected = parse_collector_lines([json.dumps(record)])
    assert len(collected.events) + collected.rejected == 1
