"""`make demo DEMO_APPROVE=1` from a clean clone ends with the culprit's node drained and prints
`report: PATH` last.

The clone gets its own virtual environment whose third-party packages come from this one (a
`.pth` line; installing them again from the registry would take many minutes here), with the
clone itself installed editable: what runs is the clone's code, never this checkout's.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

# Sized to what it starts: a clean clone, its venv, and `make demo` with every service it starts.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _clone_with_venv(tmp_path: Path) -> Path:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    subprocess.run(["python3", "-m", "venv",
                    str(clone / ".venv")], check=True, timeout=120)
    packages = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
    venv_site = next((clone / ".venv" / "lib").glob("python3*/site-packages"))
    (venv_site / "denpex-test-deps.pth").write_text(packages + "\n")
    installed = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pip", "install", "--quiet",
                                "--no-deps", "-e", str(clone)], capture_output=True, text=True, timeout=180)
    assert installed.returncode == 0, installed.stderr[-2000:]
    return clone


def test_make_demo_approve_from_a_clean_clone(tmp_path: Path) -> None:
    clone = _clone_with_venv(tmp_path)
    # As from a user's shell: under `make test` (CI), an inherited MAKELEVEL makes the demo's make
    # print "make[1]: Leaving directory" after the report line.
    env = {k: v for k, v in os.environ.items() if k not in {"MAKELEVEL", "MAKEFLAGS", "MFLAGS"}}
    done = subprocess.run(["make", "demo", "DEMO_APPROVE=1"], cwd=clone, capture_output=True, text=True,
                          timeout=420, env=env)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("report: "), out[-2000:]
    report = json.loads(Path(last.removeprefix("report: ")).read_text())
    assert Path(last.removeprefix("report: ")).is_relative_to(clone / "out" / "demo")
    assert report["verdict"] == "localized" and report["outcome"] == "executed", report["reason"]
    assert report["plan"]["actions"] == [{"node": "gpu-node-003", "action": "drain"}]
    # The approval carried demo-operator's TOTP code, through an API behind basic authentication.
    assert report["approval"]["approver"] == "demo-operator" and report["approval"]["second_factor"] == "totp"
    assert "enrolled demo-operator; add this to an authenticator app: otpauth://totp/" in out
    assert "the UI's login asks for the API's auth string: demo:" in out
    [node] = report["execution"]["nodes"]
    assert node["node"] == "gpu-node-003" and "DRAIN" in node["state_after"]
    assert "[demo] slurm: gpu-node-003 State=IDLE+DRAIN" in out
    # Each rank's Python stacks went with its dump and were read back from the S3 store, as triage reads them.
    assert "[demo] the service stored the ranks' Python stacks beside their dumps (collector: ranks 0, 1, 2, 3)" in out
    assert '"kind":"intent"' in out and '"kind":"result"' in out  # the audit log is shown
    assert "data:image/png;base64" not in out  # charts are named by path, not dumped as base64
    # reports/<tenant>/<cluster>/<incident>-<run>.json in the run's state folder: the run's folder is four up.
    charts = sorted((Path(last.removeprefix("report: ")).parents[4] / "charts").glob("chart-*.png"))
    assert charts and all(c.read_bytes().startswith(b"\x89PNG") for c in charts)
    assert f"{charts[0]}]" in out


def test_the_demo_drains_a_dead_ranks_node_from_the_registered_manifest(tmp_path: Path) -> None:
    """`make demo DEMO=examples/incident-dead-rank DEMO_APPROVE=1`, run as the Makefile runs it (this
    checkout's code): rank 1 left no dump, the kernel log holds an Xid 79 for its node. The demo
    registers the folder's manifest through `POST /v1/jobs/{job_id}/ranks` before the uploads, and the
    node's agent sends its kernel log alone: gpu-node-002 is drained."""
    folder = ROOT / "examples" / "incident-dead-rank"
    assert not (folder / "rank_1.pkl").exists() and "gpu-node-002" in (folder / "kernel.log").read_text()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), str(folder), "--store", "s3",
                           "--approve", "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                          timeout=420, env=env)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-3000:]
    assert "[demo] registered job gloo-sigkill's layout (4 ranks)" in out
    assert "[demo] gpu-node-002 left no dump; its node agent sent its kernel log alone" in out
    report = json.loads(Path(out.strip().splitlines()[-1].removeprefix("report: ")).read_text())
    assert report["outcome"] == "executed", report["reason"]
    assert [c["rank"] for c in report["candidates"]] == [1]
    assert report["plan"]["actions"] == [{"node": "gpu-node-002", "action": "drain"}]
    assert "[demo] slurm: gpu-node-002 State=IDLE+DRAIN" in out
