"""Runbooks: the shipped one loads and equals the built-in policy; mistakes fail loudly."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from denpex.isolation.errors import RunbookError
from denpex.isolation.policy import IsolationPolicy
from denpex.isolation.runbook import Runbook, form_runbook_refusal, load_runbook

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "runbooks" / "gpu-hardware-fault.yaml"


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


def _with_second_factor(tmp_path: Path, second_factor: str) -> Runbook:
    body = yaml.safe_load((ROOT / "runbooks" / "hang-triage.yaml").read_text())
    body["approval"] = dict(body["approval"], second_factor=second_factor, channels=["cli-signed", "prefect-ui"])
    path = tmp_path / "form.yaml"
    path.write_text(yaml.safe_dump(body))
    return load_runbook(path)


def test_a_runbook_without_a_second_factor_is_followed_only_where_the_operator_names_it(tmp_path: Path) -> None:
    form = _with_second_factor(tmp_path, "none")
    refusal = form_runbook_refusal("form", form, allowed=frozenset())
    assert refusal is not None and "DENPEX_PREFECT_FORM_RUNBOOKS" in refusal and refusal.endswith("nothing was done")
    assert "(it allows: none)" in refusal
    assert "(it allows: other)" in str(form_runbook_refusal("form", form, allowed={"other"}))
    assert form_runbook_refusal("form", form, allowed={"form"}) is None
    # A runbook with a second factor needs no allowance.
    assert form_runbook_refusal("form", _with_second_factor(tmp_path, "totp"), allowed=frozenset()) is None
    assert form_runbook_refusal("form", _with_second_factor(tmp_path, "proxy"), allowed=frozenset()) is None


def test_the_allowance_is_read_as_names_separated_by_spaces_or_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    from blocks.runbook import FORM_RUNBOOKS_ENV, form_runbooks

    monkeypatch.delenv(FORM_RUNBOOKS_ENV, raising=False)
    assert form_runbooks() == frozenset()
    monkeypatch.setenv(FORM_RUNBOOKS_ENV, " solo-operator,lab-form  other ")
    assert form_runbooks() == {"solo-operator", "lab-form", "other"}
