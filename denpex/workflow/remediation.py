"""Carry out an approved plan from the flow through the one execution entry point.

``execute_approved`` (issue 8) re-checks everything against the operator's configuration: the
runbook's policy, the approval's channel and approver, the cluster, the audit chain, the gates on
live facts. The flow retries only transient faults (``is_transient``: a dropped connection, a
controller away for a moment, another run holding the lock); a refusal is final.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from denpex.isolation.adapter import ClusterAdapter
from denpex.isolation.approval import Approval
from denpex.isolation.config import IsolationSettings
from denpex.isolation.errors import ConfigError, is_transient
from denpex.isolation.execute import execute_approved
from denpex.isolation.executor import ExecutionReport, RunMode
from denpex.isolation.operator import OperatorConfig, load_operator_config
from denpex.isolation.plan import IsolationPlan, Operation
from denpex.isolation.policy import Scheduler
from denpex.isolation.slurm import SlurmAdapter
from denpex.isolation.ssh import SshRunner

__all__ = ["is_transient", "execute_approved_plan"]


def execute_approved_plan(plan: IsolationPlan, approval: Approval, settings: IsolationSettings, *,
                          operation: Operation = Operation.ISOLATE) -> ExecutionReport:
    """Execute ``plan`` under ``approval`` on the cluster ``settings`` reach."""
    operator = load_operator_config(settings, os.environ)
    with _adapter(plan, settings, operator) as adapter:
        return execute_approved(plan, approval, operator=operator, adapter=adapter, mode=RunMode.EXECUTE,
                                operation=operation)


# The same wiring as ``denpex isolate`` (denpex/isolation/commands.py ``_adapter``); kept here
# because that one lives in the CLI module. TODO(coordinator): one shared ``connect_adapter``.
@contextmanager
def _adapter(plan: IsolationPlan, settings: IsolationSettings, operator: OperatorConfig) -> Iterator[ClusterAdapter]:
    limits = operator.policy.limits  # the operator's limits, never the plan's
    if plan.scheduler is Scheduler.SLURM:
        if settings.ssh is None:
            raise ConfigError("no SSH settings for the Slurm target: register a denpex-slurm-target block")
        with SshRunner(settings.ssh) as runner:
            yield SlurmAdapter(runner, opt_out_feature=limits.opt_out_feature, backoff=settings.ssh.backoff,
                               actor=settings.slurm_user or settings.ssh.username)
        return
    if settings.kubernetes is None:
        raise ConfigError("no Kubernetes settings: register a denpex-kubernetes-target block")
    from denpex.isolation.kubernetes import KubernetesAdapter  # the client is slow to import

    with KubernetesAdapter.connect(settings.kubernetes, opt_out_label=limits.opt_out_label,
                                   eviction=operator.policy.remediation.eviction) as adapter:
        yield adapter
