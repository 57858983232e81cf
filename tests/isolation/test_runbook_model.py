"""Runbooks: the shipped one loads and equals the built-in policy; mistakes fail loudly."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from denpex.isolation.errors import RunbookError
from denpex.isolation.policy import IsolationPolicy
from denpex.isolation.runbook import load_runbook

SHIPPED = Path(__file__).resolve().parents[2] / "runbooks" / "gpu-hardware-fault.yaml"


def test_shipped_runbook_is_the_default_policy() -> None:
    runbook = load_runbook(SHIPPED)
    assert runbook.name == "gpu-hardware-fault" and runbook.owner == "gpu-oncall"
    assert runbook.policy() == IsolationPolicy()


def _variant(tmp_path: Path, change) -> Path:
    body = yaml.safe_load(SHIPPED.read_text())
    change(body)
    path = tmp_path / "runbook.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        pytest.param(lambda b: b["limits"].update(max_node_per_incident=5), "limits.max_node_per_incident",
                     id="typo-key"),
        pytest.param(lambda b: b["remediation"]["slurm"]["check"].remove("reason_not_foreign"),
                     "missing: reason_not_foreign", id="safety-check-dropped"),
        pytest.param(lambda b: b["remediation"]["slurm"].update(act="cordon_taint"), "slurm must act 'drain'",
                     id="wrong-action"),
        pytest.param(lambda b: b["limits"].update(max_isolated_fraction=1.5), "max_isolated_fraction",
                     id="fraction-over-one"),
        pytest.param(lambda b: b["evidence"].update(max_age="-PT1H"), "positive duration", id="negative-age"),
        pytest.param(lambda b: b.pop("owner"), "owner", id="no-owner"),
    ],
)
def test_invalid_runbooks_are_refused(tmp_path: Path, change, needle: str) -> None:
    with pytest.raises(RunbookError, match=needle):
        load_runbook(_variant(tmp_path, change))


def test_stricter_runbook_changes_the_policy(tmp_path: Path) -> None:
    path = _variant(tmp_path, lambda b: b["limits"].update(max_nodes_per_incident=1, opt_out_nodes=["gpu-node-007"]))
    policy = load_runbook(path).policy()
    assert policy.limits.max_nodes_per_incident == 1 and "gpu-node-007" in policy.limits.opt_out_nodes
