"""Carry out an approved plan from the flow: reach the cluster, run the executor, classify faults.

The flow retries only transient faults (a dropped connection, a controller away for a moment,
another run holding the lock). A refused gate, a bad approval or an authentication error is final:
retrying it could only act on something a person did not approve.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from denpex.evidence.store import open_store
from denpex.isolation.adapter import ClusterAdapter
from denpex.isolation.approval import Approval
from denpex.isolation.audit import AuditLog
from denpex.isolation.breaker import CircuitBreaker
from denpex.isolation.config import IsolationSettings
from denpex.isolation.errors import BusyError, ConfigError, TransientRemoteError
from denpex.isolation.executor import ExecutionReport, Executor, RunMode
from denpex.isolation.plan import IsolationPlan, Operation
from denpex.isolation.policy import Scheduler
from denpex.isolation.slurm import SlurmAdapter
from denpex.isolation.ssh import SshRunner

__all__ = ["is_transient", "execute_approved_plan"]


def is_transient(exc: BaseException) -> bool:
    """True for faults that may pass on their own; never for refusals or bad credentials."""
    return isinstance(exc, TransientRemoteError | BusyError)


def execute_approved_plan(plan: IsolationPlan, approval: Approval, settings: IsolationSettings, *,
                          operation: Operation = Operation.ISOLATE) -> ExecutionReport:
    """Execute ``plan`` under ``approval``: the executor re-checks approval and gates on live facts."""
    with _adapter(plan, settings) as adapter:
        executor = Executor(
            adapter=adapter, audit=AuditLog(settings.audit_log), breaker=CircuitBreaker(settings.breaker_state),
            store=open_store(settings.evidence_store) if settings.evidence_store else None,
            verify_timeout_s=settings.verify_timeout_s,
        )
        return executor.run(plan, mode=RunMode.EXECUTE, operation=operation, approval=approval)


@contextmanager
def _adapter(plan: IsolationPlan, settings: IsolationSettings) -> Iterator[ClusterAdapter]:
    limits = plan.policy.limits
    if plan.scheduler is Scheduler.SLURM:
        if settings.ssh is None:
            raise ConfigError("no SSH settings for the Slurm target: register a denpex-slurm-target block")
        with SshRunner(settings.ssh) as runner:
            yield SlurmAdapter(runner, opt_out_feature=limits.opt_out_feature, backoff=settings.ssh.backoff)
        return
    if settings.kubernetes is None:
        raise ConfigError("no Kubernetes settings: register a denpex-kubernetes-target block")
    from denpex.isolation.kubernetes import KubernetesAdapter  # the client is slow to import

    with KubernetesAdapter.connect(settings.kubernetes, opt_out_label=limits.opt_out_label) as adapter:
        yield adapter
