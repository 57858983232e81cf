"""``denpex triage --telemetry`` and ``denpex collect-telemetry`` through the real command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from denpex.cli import app
from denpex.hardware import load_telemetry
from dumps import dump, history, write
from testkit.fakes.pynvml import FakeClock, FakeGpu, FakeNvml, skip_if_nvml_works

runner = CliRunner()


@pytest.fixture
def withheld(tmp_path: Path) -> Path:
    """Rank 2 (gpu-node-003, GPU 3b, pid 4300) never enters collective #6; its dumps end 2025-11-29T18:45:02Z."""
    dumps = {r: dump(history("0", 5, pending=0 if r == 2 else 1)) for r in range(4)}
    ranks = {str(r): {"host": f"gpu-node-00{r + 1}", "local_rank": 0, "pid": 4000 + 100 * r + 100,
                      "gpu_pci_bus_id": "0000:3b:00.0"} for r in range(4)}
    return write(tmp_path / "dumps", dumps, manifest={
        "world_size": 4, "ranks": ranks, "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}})


def kernel_log(tmp_path: Path, *msgs: tuple[str, str]) -> Path:
    path = tmp_path / "kernel.log"
    path.write_text("".join(f"2025-11-29T18:44:30+0000 {host} kernel: {msg}\n" for host, msg in msgs))
    return path


def test_triage_with_telemetry_fills_candidate_hardware(withheld: Path, tmp_path: Path) -> None:
    log = kernel_log(tmp_path, ("gpu-node-003", "NVRM: Xid (PCI:0000:3b:00): 79, pid=4300, name=python, GPU has fallen off the bus."))
    result = runner.invoke(app, ["triage", str(withheld), "--telemetry", str(log), "--format", "json"])
    assert result.exit_code == 0, result.output
    [candidate] = json.loads(result.stdout)["candidates"]
    assert candidate["rank"] == 2
    [hw] = candidate["hardware"]
    assert (hw["kind"], hw["code"], hw["bearing"], hw["time"]) == ("xid", 79, "supports_hardware_fault", "2025-11-29T18:44:30Z")
    text = runner.invoke(app, ["triage", str(withheld), "--telemetry", str(log)])
    assert text.exit_code == 0, text.output
    # People read the bearing as a phrase (denpex.hardware.describe), not as the enum's JSON value.
    assert ("hardware: [supports a hardware fault] 2025-11-29T18:44:30Z gpu-node-003: Xid 79 "
            in text.stdout) and "consistent with a hardware fault" in text.stdout


def test_telemetry_is_repeatable_and_other_hosts_are_reported(withheld: Path, tmp_path: Path) -> None:
    log = kernel_log(tmp_path, ("gpu-node-001", "NVRM: Xid (PCI:0000:3b:00): 48, Double Bit ECC"))
    extra = tmp_path / "node3.jsonl"
    extra.write_text(json.dumps({"v": 1, "type": "xid", "host": "gpu-node-003", "time": "2025-11-29T18:44:00Z",
                                 "gpu": {"pci_bus_id": "00000000:3B:00.0"}, "code": 13}) + "\n")
    result = runner.invoke(app, ["triage", str(withheld), "--telemetry", str(log), "--telemetry", str(extra),
                                 "--format", "json"])
    body = json.loads(result.stdout)
    assert body["verdict"] == "ambiguous"
    assert [h["bearing"] for h in body["candidates"][0]["hardware"]] == ["points_at_application"]
    assert [(h["host"], h["code"]) for h in body["other_hardware"]] == [("gpu-node-001", 48)]


def test_unreadable_telemetry_is_unusable_input(withheld: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["triage", str(withheld), "--telemetry", str(tmp_path / "nope.log")])
    assert result.exit_code == 2
    assert "nope.log: cannot read telemetry file" in result.stderr and result.stdout == ""


def test_collect_telemetry_writes_what_triage_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeGpu(uuid="GPU-0000", bus_id=b"00000000:3B:00.0")], FakeClock())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    out = tmp_path / "t.jsonl"
    result = runner.invoke(app, ["collect-telemetry", "--out", str(out), "--duration-s", "0", "--host", "gpu-node-003"])
    assert result.exit_code == 0, result.output
    assert "1 GPUs, 0 Xid events" in result.stdout
    parsed = load_telemetry([out])
    assert parsed.rejected == 0 and parsed.hosts == ["gpu-node-003"] and parsed.gpus[0].gpu.uuid == "GPU-0000"


def test_collect_telemetry_without_a_driver_exits_2_and_says_why(tmp_path: Path) -> None:
    skip_if_nvml_works()
    out = tmp_path / "t.jsonl"
    result = runner.invoke(app, ["collect-telemetry", "--out", str(out), "--duration-s", "0"])
    assert result.exit_code == 2 and "NVML did not initialise" in result.stderr
    assert [u.what for u in load_telemetry([out]).unavailable] == ["nvml"]
