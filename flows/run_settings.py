"""What Prefect's worker would give this run, rendered as the worker renders it, for
``denpex.workflow.run_settings``: the flow run's and its deployment's job variables over its work
pool's base job template (Prefect's own ``from_template_and_values``: dot keys, template
variables and defaults included), and the deployment's pull steps."""

# No `from __future__ import annotations`: see flows/triage.py.

import os
from pathlib import Path
from typing import Any

from prefect.client.orchestration import PrefectClient, get_client
from prefect.context import FlowRunContext
from prefect.utilities.asyncutils import run_coro_as_sync
from prefect.workers.base import BaseJobConfiguration
from prefect.workers.process import ProcessWorker

from denpex.state_dir import resolve_state_dir
from denpex.workflow.run_settings import SERVED_MARKER, check_approval_secrets, check_run_settings

__all__ = ["check_this_runs_settings", "CODE_ROOT"]

CODE_ROOT = Path(__file__).resolve().parent.parent
"""The folder that holds the running ``flows`` package: the only working directory a pull step may set."""


def check_this_runs_settings() -> None:
    """FlowParameterError when job variables or pull steps set what only the worker may, or when a
    process other than `denpex serve` started this run and it can reach the approval page's secrets."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None or context.flow_run.deployment_id is None:
        return  # a flow called in process: its environment is its caller's
    run_coro_as_sync(_check(context.flow_run))


async def _check(run: Any) -> None:
    async with get_client() as client:
        deployment = await client.read_deployment(run.deployment_id)
        env, command = await _rendered(client, run, deployment)
    check_run_settings(env=env, command=command, pull_steps=deployment.pull_steps, code_root=CODE_ROOT)
    check_approval_secrets(served=os.environ.get(SERVED_MARKER) == "1", work_pool=run.work_pool_name or
                           deployment.work_pool_name, state_dir=resolve_state_dir(), environ=os.environ)


async def _rendered(client: PrefectClient, run: Any, deployment: Any) -> tuple[dict[str, Any], str | None]:
    # Merged as BaseJobConfiguration.resolve_for_flow_run merges them: the run's env over the
    # deployment's, then the run's other variables over the deployment's.
    variables = dict(deployment.job_variables or {})
    run_variables = dict(run.job_variables or {})
    if isinstance(variables.get("env"), dict):
        variables["env"] = {**variables["env"], **(run_variables.pop("env", None) or {})}
    variables.update(run_variables)
    pool_name = run.work_pool_name or deployment.work_pool_name
    # Served by `denpex serve` (no work pool): the runner ignores job variables; rendered on
    # Prefect's default process template all the same, so that a variable set there is refused too.
    template = ((await client.read_work_pool(pool_name)).base_job_template if pool_name
                else ProcessWorker.get_default_base_job_template())
    configuration: BaseJobConfiguration = await BaseJobConfiguration.from_template_and_values(
        template, variables, client=client)
    return dict(configuration.env or {}), configuration.command
