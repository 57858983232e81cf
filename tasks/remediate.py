"""Carry out an approved plan: Prefect retries transient faults only, never a refusal."""

from __future__ import annotations

import os
from typing import Any

from prefect import Task, task

from denpex.isolation.approval import Approval
from denpex.isolation.config import IsolationSettings
from denpex.isolation.errors import is_transient
from denpex.isolation.plan import IsolationPlan, Operation
from denpex.isolation.run import ExecutionReport, RunMode, execute, open_cluster
from tasks.options import NOT_CACHED

__all__ = ["execute_plan", "retry_transient_only"]

# How the flow's operator provides missing connection settings.
_BLOCKS_HINT = {"ssh": "register a denpex-slurm-target block",
                "kubernetes": "register a denpex-kubernetes-target block"}


def retry_transient_only(task: Task[Any, Any], task_run: Any, state: Any) -> bool:
    """Retry a dropped connection or a held lock; never a refused gate, approval or credential."""
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001 (state.result() re-raises the task's own error)
        return is_transient(exc)
    return False


@task(name="execute-plan", retries=3, retry_delay_seconds=[2, 5, 10], retry_condition_fn=retry_transient_only, **NOT_CACHED)
def execute_plan(plan: IsolationPlan, approval: Approval, settings: IsolationSettings,
                 operation: Operation = Operation.ISOLATE) -> ExecutionReport:
    """The core executor: re-check, act once per node, verify, audit before and after."""
    with open_cluster(plan, settings, os.environ, missing_hint=_BLOCKS_HINT) as (operator, adapter):
        return execute(plan, approval, operator=operator, adapter=adapter, mode=RunMode.EXECUTE,
                       operation=operation)
