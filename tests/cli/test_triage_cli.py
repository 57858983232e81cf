"""The ``denpex triage`` contract: JSON shape, text for people, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from denpex.cli import app
from dumps import dump, history, write

runner = CliRunner()
CONTRACT_KEYS = {"verdict", "world_size", "ranks_with_evidence", "missing_ranks", "candidates", "plan"}


@pytest.fixture
def withheld(tmp_path: Path) -> Path:
    dumps = {r: dump(history("0", 5, pending=0 if r == 2 else 1)) for r in range(4)}
    return write(tmp_path, dumps, manifest={
        "world_size": 4, "ranks": {"2": {"host": "gpu-node-003"}},
        "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}})


def test_json_output_follows_the_contract(withheld: Path) -> None:
    result = runner.invoke(app, ["triage", str(withheld), "--format", "json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert CONTRACT_KEYS <= body.keys()
    assert body["verdict"] == "localized" and body["missing_ranks"] == []
    [candidate] = body["candidates"]
    assert candidate["rank"] == 2 and candidate["kind"] == "not_entered"
    assert candidate["process_group"] == "0" and candidate["collective_seq_id"] == 6
    assert candidate["host"] == "gpu-node-003" and candidate["hardware"] == []
    assert set(body["plan"]) == {"recommend_isolation", "actions", "blocked"}
    assert body["plan"]["recommend_isolation"] is False


def test_text_output_says_who_waits_and_who_is_behind(withheld: Path) -> None:
    result = runner.invoke(app, ["triage", str(withheld)])
    assert result.exit_code == 0
    assert result.stdout.startswith("HANG LOCALIZED: rank 2 (not_entered)")
    assert "ranks 0, 1, 3" in result.stdout and "rank 2 never enqueued it" in result.stdout
    assert "gpu-node-003" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["/nonexistent/evidence"], "no such folder", id="missing-folder"),
        pytest.param(["{folder}", "--manifest", "{folder}/nope.json"], "cannot read manifest", id="missing-manifest"),
        pytest.param(["{folder}", "--as-of", "yesterday"], "not an ISO time", id="bad-as-of"),
        pytest.param(["{folder}", "--world-size", "8"], "contradicts the manifest", id="size-conflict"),
    ],
)
def test_unusable_input_exits_2_with_one_line(withheld: Path, args: list[str], message: str) -> None:
    argv = ["triage"] + [a.format(folder=withheld) for a in args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_invalid_manifest_names_every_problem(tmp_path: Path) -> None:
    write(tmp_path, {0: dump(history("0", 2))})
    (tmp_path / "manifest.json").write_text(json.dumps(
        {"world_size": 2, "ranks": {"5": {"hots": "x"}}}))
    result = runner.invoke(app, ["triage", str(tmp_path)])
    assert result.exit_code == 2
    assert "ranks.5.hots" in result.stderr and "Extra inputs are not permitted" in result.stderr


def test_console_script_runs(withheld: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "denpex", "triage", str(withheld), "--format", "json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verdict"] == "localized"


def test_text_output_names_a_host_whose_ranks_all_went_silent(tmp_path: Path) -> None:
    write(tmp_path, {r: dump(history("0", 5, pending=1)) for r in (0, 1)}, manifest={
        "world_size": 4, "ranks": {str(r): {"host": f"gpu-node-00{1 + r // 2}"} for r in range(4)},
        "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}})
    result = runner.invoke(app, ["triage", str(tmp_path)])
    assert result.exit_code == 0
    headline, host_line = result.stdout.splitlines()[:2]
    assert headline.startswith("EVIDENCE INCOMPLETE: rank 2 (stopped_reporting), rank 3")
    assert host_line == "  2 candidates on gpu-node-002: ranks 2, 3 (stopped_reporting)"


def _run_with_stderr(folder: Path, stderr_tty: bool) -> tuple[str, bytes]:
    """``denpex triage --format json`` in a real process; stderr on a pseudo-terminal or a pipe."""
    import os
    import pty

    denpex = Path(sys.executable).parent / "denpex"
    argv = [str(denpex), "triage", str(folder), "--format", "json"]
    if not stderr_tty:
        done = subprocess.run(argv, capture_output=True, timeout=300, check=True)
        return done.stdout.decode(), done.stderr
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower)
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            drawn += chunk
        out, _ = proc.communicate(timeout=300)
    finally:
        os.close(leader)
    assert proc.returncode == 0
    return out.decode(), drawn


def test_progress_goes_to_a_terminal_stderr_only(tmp_path: Path) -> None:
    """Issue 9, family 10: a long triage shows progress on a terminal; stdout stays pure JSON."""
    dumps = {r: dump(history("0", 3, pending=0 if r == 5 else 1)) for r in range(70)}
    write(tmp_path, dumps, manifest={"world_size": 70})
    out, drawn = _run_with_stderr(tmp_path, stderr_tty=True)
    assert json.loads(out)["verdict"] == "localized"
    assert b"reading dumps" in drawn and b"70/70" in drawn
    out, stderr = _run_with_stderr(tmp_path, stderr_tty=False)
    assert json.loads(out)["verdict"] == "localized" and stderr == b""
