"""The circuit breaker's persisted state: trips stick until a named person resets them."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from denpex.cli import app
from denpex.isolation.breaker import CircuitBreaker
from denpex.isolation.errors import ConfigError
from isolation.triage_cases import NOW


def test_trip_persists_across_instances_until_reset(tmp_path: Path) -> None:
    path = tmp_path / "state" / "breaker.json"
    assert not CircuitBreaker(path).state().tripped
    CircuitBreaker(path).trip(reason="3 nodes over the limit of 2", incident_id="inc-1", at=NOW)
    # A second trip keeps the first story.
    CircuitBreaker(path).trip(reason="other", incident_id="inc-2", at=NOW + timedelta(minutes=1))
    state = CircuitBreaker(path).state()
    assert state.tripped and state.tripped_by_incident == "inc-1" and state.trip_reason.startswith("3 nodes")
    with pytest.raises(ConfigError, match="--by NAME"):
        CircuitBreaker(path).reset(by="  ", at=NOW)
    reset = CircuitBreaker(path).reset(by="alice", at=NOW + timedelta(hours=1))
    assert not reset.tripped and reset.reset_by == "alice"
    assert not CircuitBreaker(path).state().tripped


def test_damaged_state_keeps_automation_off_until_reset(tmp_path: Path) -> None:
    path = tmp_path / "breaker.json"
    path.write_text('{"tripped": tru')
    with pytest.raises(ConfigError, match="breaker state is damaged"):
        CircuitBreaker(path).state()
    CircuitBreaker(path).reset(by="alice", at=NOW)
    assert not CircuitBreaker(path).state().tripped


def test_cli_status_and_reset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "breaker.json"
    monkeypatch.setenv("DENPEX_STATE_DIR", str(tmp_path))
    CircuitBreaker(path).trip(reason="too many", incident_id="inc-1", at=NOW)
    runner = CliRunner()
    status = runner.invoke(app, ["breaker", "status"])
    assert status.exit_code == 0 and '"tripped": true' in status.stdout
    reset = runner.invoke(app, ["breaker", "reset", "--by", "bob"])
    assert reset.exit_code == 0 and "reset by bob" in reset.stdout
    assert not CircuitBreaker(path).state().tripped


def test_cli_refuses_a_relative_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    # A relative state directory would give each working directory a breaker of its own.
    monkeypatch.setenv("DENPEX_STATE_DIR", "state")
    status = CliRunner().invoke(app, ["breaker", "status"])
    assert status.exit_code == 2 and "is relative; set DENPEX_STATE_DIR to an absolute path" in status.stderr
