"""The NVML collector against a fake at the pynvml module boundary, and its output read back."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pynvml
import pytest

from denpex.hardware import NvmlUnavailableError, Severity, SignalKind, parse_telemetry_lines
from denpex.hardware.nvml_collector import collect_telemetry, load_pynvml
from testkit.fakes.pynvml import FakeClock, FakeGpu, FakeNvml, skip_if_nvml_works

REPLAY, RECOVERY = pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY


def h100(n: int, **kw: object) -> FakeGpu:
    return FakeGpu(uuid=f"GPU-000{n}", bus_id=f"00000000:{0x3B + n:02X}:00.0".encode(), **kw)


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    """A sysfs-like tree: /sys/bus/pci/devices/<bdf> links into the device hierarchy."""
    devices = tmp_path / "bus" / "pci" / "devices"
    devices.mkdir(parents=True)
    target = tmp_path / "devices" / "pci0000:00" / "0000:00:01.0" / "0000:3a:00.0" / "0000:3b:00.0"
    target.mkdir(parents=True)
    (devices / "0000:3b:00.0").symlink_to(target)
    return devices


def run(nvml: FakeNvml, clock: FakeClock, sysfs: Path | None = None, duration: float = 30.0):
    out = io.StringIO()
    summary = collect_telemetry(out, duration_s=duration, host="gpu-node-002", nvml=nvml, clock=clock.wall,
                                monotonic=clock.monotonic, sleep=clock.sleep, sysfs_pci=sysfs)
    return summary, out.getvalue().splitlines()


def test_full_collection_reads_back_as_events(sysfs: Path) -> None:
    clock = FakeClock()
    gpus = [h100(0, counters={(1, RECOVERY): (2, 5), (0, REPLAY): (7, 7)}), h100(1)]
    nvml = FakeNvml(gpus, clock, xids=[(12.5, 0, 79)])
    summary, lines = run(nvml, clock, sysfs)
    assert (summary.gpus, summary.xid_events) == (2, 1)
    assert nvml.initialized and nvml.shutdown_called and nvml.freed and nvml.registered == [0, 1]
    assert clock.now == pytest.approx(30.0)

    result = parse_telemetry_lines(lines)
    assert result.rejected == 0 and result.hosts == ["gpu-node-002"]
    xid = next(e for e in result.events if e.kind is SignalKind.XID)
    assert (xid.code, xid.severity, xid.gpu.pci_bus_id, xid.gpu.uuid) == (79, Severity.FATAL, "0000:3b:00.0", "GPU-0000")
    assert xid.time.isoformat() == "2026-11-29T18:40:12.500000+00:00"
    [link] = [e for e in result.events if e.kind is SignalKind.NVLINK]
    assert (link.link, link.gpu.pci_bus_id) == (1, "0000:3b:00.0") and "dl_recovery +3" in link.detail
    identity = {g.gpu.pci_bus_id: g for g in result.gpus}
    assert identity["0000:3b:00.0"].pcie_path == ("0000:00:01.0", "0000:3a:00.0")
    assert identity["0000:3c:00.0"].pcie_path is None
    assert [(u.what, u.gpu.pci_bus_id) for u in result.unavailable] == [("pcie_path", "0000:3c:00.0")]
    phases = [json.loads(line).get("phase") for line in lines if '"session"' in line]
    assert phases == ["start", "end"]


@pytest.mark.parametrize(
    ("gpu", "what"),
    [
        pytest.param(h100(0, links=None), ["nvlink"], id="pcie-card-without-nvlink"),
        pytest.param(h100(0, remapped=None), ["remapped_rows"], id="no-row-remapper"),
        pytest.param(h100(0, unsupported_counters={REPLAY}), ["nvlink_dl_replay"], id="one-counter-unsupported"),
        pytest.param(h100(0, events_supported=False), ["xid_events"], id="xid-events-unsupported"),
    ],
)
def test_not_supported_is_recorded_as_not_available_never_healthy(gpu: FakeGpu, what: list[str]) -> None:
    clock = FakeClock()
    _, lines = run(FakeNvml([gpu], clock), clock)
    result = parse_telemetry_lines(lines)
    gaps = {u.what for u in result.unavailable}
    assert set(what) <= gaps
    assert all(u.detail == "Not Supported" for u in result.unavailable if u.what in what)
    # Written once, although both snapshots met the same unsupported call.
    written = [(u.what, u.link) for u in result.unavailable if u.what in what]
    assert len(written) == len(set(written))
    if "nvlink" in what:
        assert not any('"nvlink"' in line and '"counters"' in line for line in lines)


def test_inactive_links_have_no_counters() -> None:
    clock = FakeClock()
    _, lines = run(FakeNvml([h100(0, links=[True, False], counters={(1, RECOVERY): (0, 9)})], clock), clock)
    records = [json.loads(line) for line in lines if '"type":"nvlink"' in line]
    assert {(r["link"], r["active"], bool(r.get("counters"))) for r in records} == {(0, True, True), (1, False, False)}


def test_nvml_init_failure_is_written_and_raised() -> None:
    clock = FakeClock()
    out = io.StringIO()
    nvml = FakeNvml([], clock, init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(NvmlUnavailableError, match="gpu-node-002: Driver Not Loaded"):
        collect_telemetry(out, duration_s=1, host="gpu-node-002", nvml=nvml, clock=clock.wall)
    [gap] = parse_telemetry_lines(out.getvalue().splitlines()).unavailable
    assert (gap.what, gap.detail) == ("nvml", "Driver Not Loaded")


def test_event_set_failure_still_takes_both_snapshots() -> None:
    clock = FakeClock()
    gpu = h100(0, counters={(0, RECOVERY): (1, 2)})
    _, lines = run(FakeNvml([gpu], clock, event_set_error=pynvml.NVML_ERROR_NO_PERMISSION), clock, duration=5)
    result = parse_telemetry_lines(lines)
    assert [u.what for u in result.unavailable if u.what != "pcie_path"] == ["xid_events"]
    assert [e.kind for e in result.events] == [SignalKind.NVLINK]
    assert clock.now == pytest.approx(5.0)


def test_gpu_lost_while_listening_is_recorded_and_the_collection_finishes() -> None:
    clock = FakeClock()
    _, lines = run(FakeNvml([h100(0)], clock, wait_error_at=3.0), clock, duration=10)
    result = parse_telemetry_lines(lines)
    gaps = [(u.what, u.detail) for u in result.unavailable if u.what != "pcie_path"]
    assert gaps == [("xid_events", "GPU is lost")]
    assert '"phase":"end"' in lines[-1]


def test_gpu_lost_before_the_second_snapshot_is_one_gap_per_signal_never_healthy() -> None:
    """A GPU that falls off the bus mid-collection: its snapshot 1 is "not available", once per signal."""
    clock = FakeClock()
    gpus = [h100(0, links=[True] * 18, lost_at=5.0), h100(1, counters={(0, RECOVERY): (1, 4)})]
    _, lines = run(FakeNvml(gpus, clock), clock, duration=10)
    result = parse_telemetry_lines(lines)
    lost = sorted((u.what, u.link) for u in result.unavailable if u.detail == "GPU is lost")
    assert lost == [("nvlink", None), ("remapped_rows", None)]
    assert all(u.gpu is not None and u.gpu.index == 0 for u in result.unavailable if u.detail == "GPU is lost")
    # Nothing about GPU 0 reads as a healthy second snapshot; GPU 1 is still read.
    assert not [line for line in lines if '"snapshot":1' in line and '"index":0' in line]
    assert [(e.kind, e.gpu.index) for e in result.events] == [(SignalKind.NVLINK, 1)]


def test_no_gpus_listed_is_not_available_never_healthy() -> None:
    """A container started without GPU access: NVML runs but lists none; nothing was read."""
    clock = FakeClock()
    summary, lines = run(FakeNvml([], clock), clock, duration=1)
    [gap] = parse_telemetry_lines(lines).unavailable
    assert (gap.what, gap.gpu, summary.gpus) == ("gpus", None, 0) and "no GPUs" in gap.detail


def test_real_pynvml_without_a_gpu_reports_nvml_unavailable() -> None:
    """The real library on a machine without the NVIDIA driver: a clean, written refusal."""
    skip_if_nvml_works()
    out = io.StringIO()
    with pytest.raises(NvmlUnavailableError, match="NVML did not initialise"):
        collect_telemetry(out, duration_s=0, host="ci", nvml=load_pynvml())
    [gap] = parse_telemetry_lines(out.getvalue().splitlines()).unavailable
    assert gap.what == "nvml" and gap.detail
