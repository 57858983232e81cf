"""`make demo DEMO_APPROVE=1` from a clean clone ends with the culprit's node drained and prints
`report: PATH` last.

The clone borrows the suite's installed packages rather than installing them: CI proves the
install by running `make test` from a clean clone. Its virtual environment (made without pip)
names this one's site-packages and the clone itself in two `.pth` lines, so that what runs is the
clone's code, never this checkout's, and `make` finds its setup done. One whole demo, from the
Makefile; what the demo does with other folders runs on the shared flow rig
(`test_demo_folders.py`), and its signals and teardown in `test_demo_signals.py`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

# Sized to what it starts: a clean clone, its venv, and `make demo` with every service it starts.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _clone_with_venv(tmp_path: Path) -> Path:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    venv = clone / ".venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    import prefect

    packages = str(Path(prefect.__file__).resolve().parents[1])  # where the suite's packages are installed
    venv_site = next((venv / "lib").glob("python3*/site-packages"))
    # The clone first, then the borrowed packages: a .pth line adds a folder to sys.path but runs
    # none of the .pth files in it (so this checkout's editable install is not seen).
    (venv_site / "denpex-clone.pth").write_text(f"{clone}\n")
    (venv_site / "denpex-test-deps.pth").write_text(packages + "\n")
    # The console script `make` checks for its setup (newer than pyproject.toml: nothing to install).
    script = venv / "bin" / "denpex"
    script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom denpex.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    # From the clone, as `make demo` runs (from elsewhere, the current folder's denpex comes first).
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import denpex; print(denpex.__file__)"],
                           capture_output=True, text=True, timeout=60, check=True, cwd=clone).stdout.strip()
    assert where == str(clone / "denpex" / "__init__.py"), where
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
    # The run's address leads through the UI's login (tests/prefect_server opens it logged out).
    assert re.search(r"PAUSED for approval: the run lab/demo-\S+ in the Prefect UI: http://127\.0\.0\.1:\d+"
                     r"/v2/login\?redirectTo=%2Fruns%2Fflow-run%2F[0-9a-f-]{36} ", out), out[-3000:]
    [node] = report["execution"]["nodes"]
    assert node["node"] == "gpu-node-003" and "DRAIN" in node["state_after"]
    assert "[demo] slurm: gpu-node-003 State=IDLE+DRAIN" in out
    # The lab's SSH key came from the workers' credentials folder, never from the target block,
    # whose secrets Prefect gives to any API client (red team, issue 30): no key was written from one.
    run_dir = Path(last.removeprefix("report: ")).parents[4]
    assert (run_dir / "cluster-secrets" / "lab.ssh-key").stat().st_mode & 0o777 == 0o600
    keys = run_dir / "state" / "keys"
    assert len(list(keys.glob("slurm-lab.*.known_hosts"))) == 1 and not (keys / "slurm-lab.key").exists()
    # Each rank's Python stacks went with its dump and were read back from the S3 store, as triage reads them.
    assert "[demo] the service stored the ranks' Python stacks beside their dumps (collector: ranks 0, 1, 2, 3)" in out
    assert '"kind":"intent"' in out and '"kind":"result"' in out  # the audit log is shown
    assert "data:image/png;base64" not in out  # charts are named by path, not dumped as base64
    # The report is printed as text, not as the artifact's markdown (issue 31: `all\_reduce`, `\(4 ranks\)`).
    shown = out.split("[demo] audit log")[0]
    assert "all_reduce" in shown and "\\_" not in shown and "\\(" not in shown and "**" not in shown
    # reports/<tenant>/<cluster>/<incident>-<run>.json in the run's state folder: the run's folder is four up.
    charts = sorted((Path(last.removeprefix("report: ")).parents[4] / "charts").glob("chart-*.png"))
    assert charts and all(c.read_bytes().startswith(b"\x89PNG") for c in charts)
    assert f"{charts[0]}]" in out


def test_the_report_is_printed_as_text_and_code_stays_literal() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo_script", ROOT / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    markdown = ("**Verdict**: all\\_reduce \\(4 ranks\\), `a__b__c`\n```\n"
                '  File "/job/__main__.py", line 3, in __next__\n  C:\\data\\x\n```\nafter **bold**')
    assert demo._terminal_text(markdown) == (
        "Verdict: all_reduce (4 ranks), `a__b__c`\n```\n"
        '  File "/job/__main__.py", line 3, in __next__\n  C:\\data\\x\n```\nafter bold')
