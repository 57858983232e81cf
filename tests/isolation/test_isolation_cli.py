"""``denpex triage --scheduler`` fills the contract's ``plan`` and can save the full plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from denpex.cli import app
from denpex.isolation.plan import load_plan
from dumps import dump, history, write

runner = CliRunner()


@pytest.fixture
def killed_rank_1(tmp_path: Path) -> Path:
    """Rank 1's process was killed: no dump from it; ranks 0, 2, 3 wait in collective 6."""
    dumps = {r: dump(history("0", 5, pending=1)) for r in (0, 2, 3)}
    return write(tmp_path / "dumps", dumps, manifest={
        "job_id": "job-123", "world_size": 4,
        "ranks": {str(r): {"host": f"gpu-node-{r + 1:03d}", "gpu_pci_bus_id": "0000:3b:00.0", "pid": 4240 + r}
                  for r in range(4)},
        "process_groups": {"0": {"desc": "default_pg", "ranks": [0, 1, 2, 3]}}})


def test_killed_process_plus_xid79_in_the_kernel_log_plans_a_drain_of_that_node(
    killed_rank_1: Path, tmp_path: Path
) -> None:
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text("2025-11-29T18:44:30+0000 gpu-node-002 kernel: NVRM: Xid (PCI:0000:3b:00): 79, "
                          "pid=4241, GPU has fallen off the bus.\n")
    plan_path = tmp_path / "plan.json"
    result = runner.invoke(app, ["triage", str(killed_rank_1), "--telemetry", str(kernel_log), "--format", "json",
                                 "--scheduler", "slurm", "--cluster", "prod-a", "--plan-out", str(plan_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plan"] == {
        "recommend_isolation": True, "actions": [{"node": "gpu-node-002", "action": "drain"}], "blocked": []}
    [action] = load_plan(plan_path).actions
    assert action.ranks == (1,) and action.reason.startswith("denpex:job-123-20251129T184502Z rank 1: xid 79 at ")


@pytest.mark.parametrize("scheduler", ["slurm", "kubernetes"])
def test_triage_with_scheduler_plans_and_says_why_not(killed_rank_1: Path, tmp_path: Path, scheduler: str) -> None:
    plan_path = tmp_path / "plan.json"
    result = runner.invoke(app, ["triage", str(killed_rank_1), "--format", "json", "--scheduler", scheduler,
                                 "--cluster", "prod-a", "--plan-out", str(plan_path)])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    [culprit] = body["candidates"]
    assert culprit["rank"] == 1 and culprit["kind"] == "stopped_reporting"
    assert body["plan"] == {
        "recommend_isolation": False, "actions": [],
        "blocked": ["rank 1 stopped reporting and no hardware signal supports a fault on gpu-node-002"],
    }
    plan = load_plan(plan_path)
    assert plan.scheduler.value == scheduler and plan.contract_view() == body["plan"]
    assert plan.incident_id.startswith("job-123-") and not plan.facts_checked


def test_triage_text_shows_the_block_and_incident_id_is_deterministic(killed_rank_1: Path, tmp_path: Path) -> None:
    args = ["triage", str(killed_rank_1), "--scheduler", "slurm", "--cluster", "prod-a", "--plan-out"]
    first = runner.invoke(app, [*args, str(tmp_path / "a.json")])
    second = runner.invoke(app, [*args, str(tmp_path / "b.json")])
    assert first.exit_code == 0 and "blocked: rank 1 stopped reporting" in first.stdout
    assert second.exit_code == 0 and second.stdout == first.stdout
    assert load_plan(tmp_path / "a.json").content_hash() == load_plan(tmp_path / "b.json").content_hash()


def test_a_plan_file_names_its_cluster(killed_rank_1: Path, tmp_path: Path) -> None:
    """A plan written for execution is bound to one cluster: triage offline cannot ask the cluster
    its name, so the operator gives it; without it no plan file is written (exit 2, one line)."""
    plan_path = tmp_path / "plan.json"
    result = runner.invoke(app, ["triage", str(killed_rank_1), "--scheduler", "slurm", "--plan-out", str(plan_path)])
    assert result.exit_code == 2, result.output
    [line] = result.stderr.splitlines()
    assert line.startswith("denpex: error: ") and "--plan-out needs --cluster" in line
    assert not plan_path.exists()
    # Showing the plan without writing it needs no cluster.
    assert runner.invoke(app, ["triage", str(killed_rank_1), "--scheduler", "slurm"]).exit_code == 0
    done = runner.invoke(app, ["triage", str(killed_rank_1), "--scheduler", "slurm", "--cluster", "prod-a",
                               "--plan-out", str(plan_path)])
    assert done.exit_code == 0, done.output
    assert load_plan(plan_path).cluster == "prod-a"


def test_bad_runbook_is_unusable_input(killed_rank_1: Path, tmp_path: Path) -> None:
    bad = tmp_path / "rb.yaml"
    bad.write_text("name: x\n")
    result = runner.invoke(app, ["triage", str(killed_rank_1), "--scheduler", "slurm", "--runbook", str(bad)])
    assert result.exit_code == 2 and "invalid runbook" in result.stderr


def test_isolate_refuses_a_bad_plan_or_missing_settings(killed_rank_1: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DENPEX_SSH_HOST", "DENPEX_SSH_KEY", "DENPEX_SSH_KNOWN_HOSTS"):
        monkeypatch.delenv(name, raising=False)
    broken = tmp_path / "broken.json"
    broken.write_text("{}")
    result = runner.invoke(app, ["isolate", str(broken), "--dry-run"])
    assert result.exit_code == 2 and "not a valid isolation plan" in result.stderr
    plan = tmp_path / "plan.json"
    assert runner.invoke(app, ["triage", str(killed_rank_1), "--scheduler", "slurm", "--cluster", "prod-a",
                               "--plan-out", str(plan)]).exit_code == 0
    result = runner.invoke(app, ["isolate", str(plan), "--dry-run"])
    assert result.exit_code == 2 and "no ssh settings" in result.stderr and "DENPEX_SSH_HOST" in result.stderr


@pytest.mark.parametrize(("host", "ident", "domain", "drains"), [
    pytest.param("gpu-node-002", "kernel", None, True, id="kernel-line"),
    pytest.param("gpu-node-002", "myapp[123]", None, False, id="user-space-line"),
    pytest.param("gpu-node-002.other-cluster.example", "kernel", None, False, id="other-domain"),
    pytest.param("gpu-node-002.other-cluster.example", "kernel", "dc1.example", False, id="other-domain-configured"),
    pytest.param("gpu-node-002.dc1.example", "kernel", "dc1.example", True, id="our-domain"),
])
def test_only_kernel_lines_of_the_exact_host_support_a_drain(killed_rank_1: Path, tmp_path: Path, host: str,
                                                             ident: str, domain: str | None, drains: bool) -> None:
    """Issue 8 item 7: a spoofed user-space Xid, or one from a host of another domain, drains nothing."""
    kernel_log = tmp_path / "kern.log"
    kernel_log.write_text(f"2025-11-29T18:44:30+0000 {host} {ident}: NVRM: Xid (PCI:0000:3b:00): 79, "
                          "pid=4241, GPU has fallen off the bus.\n")
    args = ["triage", str(killed_rank_1), "--telemetry", str(kernel_log), "--format", "json", "--scheduler", "slurm"]
    result = runner.invoke(app, [*args, *(["--host-domain", domain] if domain else [])])
    assert result.exit_code == 0, result.output
    actions = json.loads(result.stdout)["plan"]["actions"]
    assert actions == ([{"node": "gpu-node-002", "action": "drain"}] if drains else [])
