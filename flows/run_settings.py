"""The job variables Prefect gave this run, read from the API for ``denpex.workflow.run_settings``:
the flow run's own, its deployment's and its work pool's base job template."""

# No `from __future__ import annotations`: see flows/triage.py.

from collections.abc import Mapping
from typing import Any

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext

from denpex.workflow.run_settings import check_run_settings, pool_job_variables

__all__ = ["check_this_runs_settings"]


def check_this_runs_settings() -> None:
    """FlowParameterError when the run, its deployment or its work pool sets what only the worker may."""
    check_run_settings(_job_variable_sources())


def _job_variable_sources() -> dict[str, Mapping[str, Any]]:
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return {}
    run = context.flow_run
    sources: dict[str, Mapping[str, Any]] = {"this run's job variables": run.job_variables or {}}
    if run.deployment_id is None:
        return sources
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(run.deployment_id)
        sources[f"deployment {deployment.name!r}'s job variables"] = deployment.job_variables or {}
        pool_name = run.work_pool_name or deployment.work_pool_name
        if pool_name:
            pool = client.read_work_pool(pool_name)
            sources[f"work pool {pool_name!r}'s base job template"] = pool_job_variables(pool.base_job_template)
    return sources
