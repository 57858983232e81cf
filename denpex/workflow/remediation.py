"""Carry out an approved plan from the flow through the one execution entry point.

``execute_approved`` (issue 8) re-checks everything against the operator's configuration: the
runbook's policy, the approval's channel and approver, the cluster, the audit chain, the gates on
live facts. The flow retries only transient faults (``is_transient``: a dropped connection, a
controller away for a moment, another run holding the lock); a refusal is final.
"""

from __future__ import annotations

import os

from denpex.isolation.approval import Approval
from denpex.isolation.config import IsolationSettings
from denpex.isolation.connect import connect_adapter
from denpex.isolation.errors import is_transient
from denpex.isolation.execute import execute_approved
from denpex.isolation.executor import ExecutionReport, RunMode
from denpex.isolation.operator import load_operator_config
from denpex.isolation.plan import IsolationPlan, Operation

__all__ = ["is_transient", "execute_approved_plan"]

_BLOCKS_HINT = {"ssh": "register a denpex-slurm-target block",
                "kubernetes": "register a denpex-kubernetes-target block"}


def execute_approved_plan(plan: IsolationPlan, approval: Approval, settings: IsolationSettings, *,
                          operation: Operation = Operation.ISOLATE) -> ExecutionReport:
    """Execute ``plan`` under ``approval`` on the cluster ``settings`` reach."""
    operator = load_operator_config(settings, os.environ)
    with connect_adapter(plan, settings, operator, missing_hint=_BLOCKS_HINT) as adapter:
        return execute_approved(plan, approval, operator=operator, adapter=adapter, mode=RunMode.EXECUTE,
                                operation=operation)
