"""`scripts/demo.py FOLDER` (`make demo DEMO=folder`) finds the dumps by the core's rule, checks the
folder before it starts anything, and takes the alert time from the evidence.

The bundled incident's real Gloo dumps are laid out as other incidents arrive: named as torch names
them (``comm_lib_trace_rank_<r>``, no extension) or as the manifest's ``dump_file`` and trailing
numbers say, with a manifest that carries no dump times (so the evidence's own times must serve).
`make demo` reinstalls the venv; this runs the script it runs, with this checkout's venv
(`test_demo.py` runs `make demo` itself from a clean clone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "examples" / "incident-xid79"

# Sized to what it starts: every service of the demo, twice under load.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _demo(folder: Path, out: Path, *extra: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), str(folder), "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def _incident(tmp_path: Path, name_of: Callable[[int], str], *, dump_file: bool = False) -> Path:
    """The bundled incident with its dumps renamed and its manifest's dump times removed."""
    folder = tmp_path / "incident"
    folder.mkdir()
    manifest = json.loads((BUNDLED / "manifest.json").read_text())
    for rank, identity in manifest["ranks"].items():
        identity.pop("dumped_at")
        name = name_of(int(rank))
        shutil.copyfile(BUNDLED / f"rank_{rank}.pkl", folder / name)
        if dump_file:
            identity["dump_file"] = name
    (folder / "manifest.json").write_text(json.dumps(manifest))
    shutil.copyfile(BUNDLED / "kernel.log", folder / "kernel.log")
    return folder


@pytest.mark.parametrize(
    ("name_of", "dump_file"),
    [
        pytest.param(lambda r: f"comm_lib_trace_rank_{r}", False, id="torch-names"),
        # Ranks 0 and 1 only by the manifest's dump_file (no rank in the name), 2 and 3 by the
        # trailing number of a name with leading zeros.
        pytest.param(lambda r: f"{'ab'[r]}-host.fr" if r < 2 else f"dump-{r:04d}.pkl", True, id="manifest-and-number"),
    ],
)
def test_a_folder_named_as_the_readme_allows_drains_the_culprits_node(
        tmp_path: Path, name_of: Callable[[int], str], dump_file: bool) -> None:
    folder = _incident(tmp_path, name_of, dump_file=dump_file)
    done = _demo(folder, tmp_path / "out", "--store", "s3", "--approve")
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("report: "), out[-2000:]
    report = json.loads(Path(last.removeprefix("report: ")).read_text())
    assert report["outcome"] == "executed", report["reason"]
    # The alert time came from the dumps' own times: no rank of the three-day-old folder is stale.
    assert report["verdict"] == "localized" and report["stale_ranks"] == [] and report["missing_ranks"] == []
    assert [c["rank"] for c in report["candidates"]] == [2]
    assert report["plan"]["actions"] == [{"node": "gpu-node-003", "action": "drain"}]
    assert "[demo] slurm: gpu-node-003 State=IDLE+DRAIN" in out
    assert "[demo] uploaded 4 of 4 ranks' dumps" in out
    assert "alert at 2026-12-03T02:08:58" in out  # six seconds after the newest entry of any dump


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(lambda f: (f / "manifest.json").write_text(json.dumps({"world_size": 4})),
                     "no Flight Recorder dumps found", id="no-dumps"),
        pytest.param(lambda f: None, "no manifest.json", id="no-manifest"),
        pytest.param(lambda f: ((f / "manifest.json").write_text("{not json"),
                                shutil.copyfile(BUNDLED / "rank_0.pkl", f / "rank_0.pkl")),
                     "manifest", id="broken-manifest"),
        pytest.param(lambda f: ((f / "manifest.json").write_text(json.dumps(
            {"world_size": 1, "ranks": {"0": {"host": "login-7"}}})),
                                shutil.copyfile(BUNDLED / "rank_0.pkl", f / "rank_0.pkl")),
                     "'login-7'] are not among them", id="host-outside-the-lab"),
    ],
)
def test_an_unusable_folder_is_one_line_before_anything_starts(
        tmp_path: Path, make: Callable[[Path], object], message: str) -> None:
    folder = tmp_path / "incident"
    folder.mkdir()
    make(folder)
    started = time.monotonic()
    done = _demo(folder, tmp_path / "out", timeout=60)
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"demo: {folder} cannot be demonstrated: ") and message in line, line
    assert not (tmp_path / "out").exists()  # no state, no server: nothing was started
    assert time.monotonic() - started < 30
