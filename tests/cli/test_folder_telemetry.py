"""``denpex triage FOLDER`` reads the telemetry that lies in the folder (``*.log``, ``*.jsonl``) by
the rule the incident flow uses (``denpex.workflow.telemetry_files``), and says which files it read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner


from denpex.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "examples" / "incident-xid79"


def test_the_bundled_incident_drains_on_its_kernel_log_without_telemetry_flag(tmp_path: Path) -> None:
    """The issue's command, as an operator types it: the kernel log's Xid 79 supports the drain."""
    done = subprocess.run([sys.executable, "-m", "denpex", "triage", str(BUNDLED), "--scheduler", "slurm",
                           "--cluster", "lab", "--plan-out", "p.json"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert "skipped kernel.log" not in done.stdout
    assert f"telemetry read: {BUNDLED / 'kernel.log'}" in done.stdout
    assert "Isolation proposed (needs approval):\n  - drain gpu-node-003" in done.stdout
    plan = json.loads((tmp_path / "p.json").read_text())
    assert [(a["node"], a["action"]) for a in plan["actions"]] == [("gpu-node-003", "drain")]


def test_json_names_the_telemetry_files_and_skips_none_of_them(tmp_path: Path) -> None:
    folder = tmp_path / "incident"
    shutil.copytree(BUNDLED, folder)
    (folder / "gpu.jsonl").write_text('{"v": 1, "type": "xid", "host": "gpu-node-001", '
                                      '"time": "2026-12-06T02:35:55Z", "code": 13}\n')
    result = runner.invoke(app, ["triage", str(folder), "--format", "json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["telemetry_files"] == [str(folder / "gpu.jsonl"), str(folder / "kernel.log")]
    assert body["skipped_files"] == []
    [culprit] = body["candidates"]
    assert [(e["kind"], e["code"]) for e in culprit["hardware"]] == [("xid", 79)]
    assert [(e["host"], e["code"]) for e in body["other_hardware"]] == [("gpu-node-001", 13)]


def test_a_folder_file_also_given_with_telemetry_is_read_once(tmp_path: Path) -> None:
    result = runner.invoke(app, ["triage", str(BUNDLED), "--format", "json",
                                 "--telemetry", str(BUNDLED / "kernel.log")])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["telemetry_files"] == [str(BUNDLED / "kernel.log")]
    [culprit] = body["candidates"]
    assert len(culprit["hardware"]) == 1


def test_telemetry_outside_the_folder_is_listed_beside_the_folders(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere.log"
    other.write_text("2026-12-06T02:35:53+0000 gpu-node-004 kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=1\n")
    result = runner.invoke(app, ["triage", str(BUNDLED), "--format", "json", "--telemetry", str(other)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["telemetry_files"] == [str(other), str(BUNDLED / "kernel.log")]
