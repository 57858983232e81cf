"""A run's settings are its worker's: job variables (the run's, its deployment's, its work pool's
template, all editable through the Prefect API) may not set Denpex's, S3's or the API's
environment variables, nor replace the command (attacker review: ``env: {DENPEX_EVIDENCE_ROOT:
s3://forged}`` on a run let a forged folder pass the evidence binding)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prefect.workers.process import ProcessWorker

from denpex.workflow.flow_parameters import FlowParameterError
from denpex.workflow.run_settings import check_run_settings, pool_job_variables

DEFAULT_TEMPLATE = ProcessWorker.get_default_base_job_template()


def test_prefects_own_process_template_and_plain_job_variables_pass() -> None:
    check_run_settings({
        "this run's job variables": {},
        "deployment 'manual''s job variables": {"working_dir": "/srv/denpex", "env": {"TZ": "UTC"}},
        "work pool 'denpex''s base job template": pool_job_variables(DEFAULT_TEMPLATE),
    })


@pytest.mark.parametrize("env", [
    {"DENPEX_EVIDENCE_ROOT": "s3://forged"},
    {"DENPEX_S3_ENDPOINT_URL": "http://attacker:9000"},
    {"DENPEX_STATE_DIR": "/tmp/empty"},
    {"AWS_ACCESS_KEY_ID": "x", "TZ": "UTC"},
    {"PREFECT_API_URL": "http://attacker/api"},
    {"denpex_runbooks_dir": "/tmp"},
])
def test_a_run_that_sets_the_workers_settings_is_refused_without_repeating_values(env: dict[str, str]) -> None:
    with pytest.raises(FlowParameterError, match="this run's job variables set") as refused:
        check_run_settings({"this run's job variables": {"env": env}})
    message = str(refused.value)
    assert all(value not in message for value in env.values())
    assert "nothing was done" in message


def test_a_replaced_command_or_an_env_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(FlowParameterError, match="replace the command") as refused:
        check_run_settings({"deployment 'manual''s job variables": {"command": "env DENPEX_EVIDENCE_ROOT=x python -m prefect.engine"},
                            "this run's job variables": {"env": "DENPEX_EVIDENCE_ROOT=x"}})
    assert "set env to something other than a mapping" in str(refused.value)


def _template(**changes: Any) -> dict[str, Any]:
    template = copy.deepcopy(DEFAULT_TEMPLATE)
    for path, value in changes.items():
        where = template
        *parents, last = path.split("__")
        for part in parents:
            where = where[part]
        where[last] = value
    return template


@pytest.mark.parametrize("template, why", [
    (_template(variables__properties__env__default={"DENPEX_EVIDENCE_ROOT": "s3://forged"}), "set DENPEX_EVIDENCE_ROOT"),
    (_template(job_configuration__env={"AWS_SECRET_ACCESS_KEY": "x"}), "set AWS_SECRET_ACCESS_KEY"),
    (_template(variables__properties__command__default="sh -c 'python -m prefect.engine'"), "replace the command"),
    (_template(job_configuration__command="bash -c evil"), "replace the command"),
])
def test_a_work_pool_template_that_sets_them_for_every_run_is_refused(template: dict[str, Any], why: str) -> None:
    with pytest.raises(FlowParameterError, match=why):
        check_run_settings({"work pool 'denpex''s base job template": pool_job_variables(template)})
