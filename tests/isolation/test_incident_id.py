"""The incident id becomes a Kubernetes taint value and the head of a Slurm reason: it must be a
valid label value (1 to 63 of ``A-Za-z0-9._-``, starting and ending with a letter or digit)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from denpex.analysis.models import TriageResult, Verdict
from denpex.cli import app
from denpex.isolation.errors import PlanError
from denpex.isolation.plan import NodeAction, incident_id_problem, load_plan, save_plan
from denpex.isolation.planner import default_incident_id, plan_isolation
from denpex.isolation.policy import ActionKind, IsolationPolicy, RollbackKind, Scheduler
from isolation.triage_cases import NOW, cluster, killed_process, signal

RULE = "1 to 63 characters from A-Z a-z 0-9 . _ -, starting and ending with a letter or digit"


def _plan(incident_id: str, scheduler: Scheduler = Scheduler.KUBERNETES):
    return plan_isolation(killed_process(hardware=[signal()]), None, IsolationPolicy(), cluster(),
                          scheduler, incident_id, NOW)


@pytest.mark.parametrize(
    "incident_id",
    ["a" * 64, "a" * 62 + "-b", "-inc", "inc-", "inc_", ".inc", "inc 42", "inc:42", "inc/42", "café-1",
     "inc\n42", ""],
    ids=["64-chars", "64-chars-cut-to-a-dash", "leading-dash", "trailing-dash", "trailing-underscore",
         "leading-dot", "space", "colon", "slash", "non-ascii", "newline", "empty"],
)
def test_a_bad_incident_id_is_refused_when_the_plan_is_made(incident_id: str) -> None:
    with pytest.raises(PlanError) as caught:
        _plan(incident_id)
    message = str(caught.value)
    assert f"incident id {incident_id!r} is not valid" in message and RULE in message
    assert "\n" not in message


@pytest.mark.parametrize("incident_id", ["a", "7", "inc-42", "job.123_x-Z", "a" * 63],
                         ids=["one-letter", "one-digit", "plain", "every-kind", "63-chars"])
def test_a_label_value_is_a_good_incident_id(incident_id: str) -> None:
    assert incident_id_problem(incident_id) is None
    plan = _plan(incident_id)
    assert plan.incident_id == incident_id
    assert plan.actions[0].reason.startswith(f"denpex:{incident_id} rank 1: ")


def test_a_plan_file_with_a_bad_incident_id_is_refused_with_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    save_plan(_plan("inc-42"), path)
    body = json.loads(path.read_text())
    body["incident_id"] = "inc-42-"
    path.write_text(json.dumps(body))
    with pytest.raises(PlanError, match=r"incident_id: .*incident id 'inc-42-' is not valid: use 1 to 63"):
        load_plan(path)


@given(job_id=st.one_of(st.none(), st.text(max_size=120)),
       as_of=st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.just(UTC)))
def test_the_default_incident_id_is_always_valid(job_id: str | None, as_of: datetime) -> None:
    result = TriageResult(verdict=Verdict.NO_HANG, world_size=1, ranks_with_evidence=[0], missing_ranks=[],
                          candidates=[], as_of=as_of)
    incident_id = default_incident_id(result, job_id)
    assert incident_id_problem(incident_id) is None, incident_id


@pytest.mark.parametrize(("job_id", "expected"), [
    ("job-123", "job-123-20261129T185000Z"),
    ("café/ß 7", "caf----7-20261129T185000Z"),
    ("__", "inc-20261129T185000Z"),
], ids=["plain", "non-ascii-and-separators", "nothing-usable"])
def test_the_default_incident_id_keeps_what_it_can_of_the_job_id(job_id: str, expected: str) -> None:
    result = TriageResult(verdict=Verdict.NO_HANG, world_size=1, ranks_with_evidence=[0], missing_ranks=[],
                          candidates=[], as_of=NOW)
    assert default_incident_id(result, job_id) == expected


@pytest.mark.parametrize("breaker", ["\u2028", "\x85", "\x0b", "\r\n"], ids=["line-separator", "nel", "vt", "crlf"])
def test_the_slurm_reason_keeps_any_text_on_one_line(breaker: str) -> None:
    summary = f"GPU has fallen off the bus{breaker}ticket #42: 'oops' $(x) ü"
    [action] = plan_isolation(killed_process(hardware=[signal(summary=summary)]), None, IsolationPolicy(),
                              cluster(), Scheduler.SLURM, "inc-42", NOW).actions
    assert action.reason.splitlines() == [action.reason]
    assert "ticket #42: 'oops' $(x) ü" in action.reason
    with pytest.raises(ValueError, match="reason must be one line"):
        NodeAction(node="gpu-node-002", action=ActionKind.DRAIN, reason=f"denpex:inc-42 a{breaker}b",
                   pre_checks=(), post_checks=(), rollback=RollbackKind.RESUME)


def test_triage_refuses_a_bad_incident_id_on_one_line(tmp_path: Path) -> None:
    from dumps import dump, history, write

    dumps = write(tmp_path / "dumps", {r: dump(history("0", 5, pending=1)) for r in (0, 2, 3)},
                  manifest={"job_id": "job-1", "world_size": 4})
    result = CliRunner().invoke(app, ["triage", str(dumps), "--scheduler", "kubernetes",
                                      "--incident-id", "INC 42/prod"])
    assert result.exit_code == 2
    assert result.stderr == (f"denpex: error: incident id 'INC 42/prod' is not valid: use {RULE} "
                             "(it becomes a Kubernetes taint value and starts the Slurm reason)\n")
