"""Served flow runs are forked from a forkserver that already imported Prefect and the flows
(flows/forked_runs.py), on the real engine against the session's Prefect API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def test_a_run_is_forked_from_the_preloaded_server_and_completes(prefect_api: str, tmp_path: Path) -> None:
    seen_file = tmp_path / "seen.json"
    env = dict(os.environ, PREFECT_API_URL=prefect_api, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    done = subprocess.run([sys.executable, str(HERE / "forked_probe.py"), str(seen_file)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runner = json.loads(done.stdout.strip().splitlines()[-1])
    assert runner == {"runner": runner["runner"], "exitcode": 0, "kind": "ForkServerProcess", "restored": True}
    seen = json.loads(seen_file.read_text())
    assert seen["preloaded"], "the run did not start from the preloaded forkserver"
    assert seen["parent"] != runner["runner"]  # the forkserver's child, not the runner's
    # The runner's main module (here the probe script) is not imported again in the run, nor then
    # in each parse worker the run starts.
    assert seen["main"] is None
