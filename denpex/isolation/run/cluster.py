"""Open the cluster a plan runs on: the operator's configuration and the adapter, once.

One wiring for every caller that executes plans: the CLI (``denpex isolate``) and the flow's
remediation task. Only the hint for missing settings differs: flags and variables for the CLI,
Prefect blocks for the flow.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from denpex.isolation.adapter import ClusterAdapter
from denpex.isolation.config import IsolationSettings
from denpex.isolation.errors import ConfigError
from denpex.isolation.operator import OperatorConfig, load_operator_config
from denpex.isolation.plan import IsolationPlan
from denpex.isolation.policy import Scheduler
from denpex.isolation.slurm import SlurmAdapter
from denpex.isolation.ssh import SshRunner

__all__ = ["open_cluster"]


@contextmanager
def open_cluster(plan: IsolationPlan, settings: IsolationSettings, environ: Mapping[str, str], *,
                 missing_hint: Mapping[str, str]) -> Iterator[tuple[OperatorConfig, ClusterAdapter]]:
    """The operator's configuration and the Slurm (over SSH) or Kubernetes adapter for
    ``plan.scheduler``, closed on exit.

    ``missing_hint["ssh"]`` / ``missing_hint["kubernetes"]`` say how to provide absent settings.
    Raises ConfigError (and the loaders' IsolationErrors) before anything is connected.
    """
    operator = load_operator_config(settings, environ)
    # The operator's limits, never the plan's: an edited plan must not switch off an opt-out.
    limits = operator.policy.limits
    if plan.scheduler is Scheduler.SLURM:
        if settings.ssh is None:
            raise ConfigError(f"no ssh settings for the Slurm target: {missing_hint['ssh']}")
        with SshRunner(settings.ssh) as runner:
            yield operator, SlurmAdapter(runner, opt_out_feature=limits.opt_out_feature,
                                         backoff=settings.ssh.backoff,
                                         actor=settings.slurm_user or settings.ssh.username)
        return
    if settings.kubernetes is None:
        raise ConfigError(f"no kubernetes settings: {missing_hint['kubernetes']}")
    from denpex.isolation.kubernetes import KubernetesAdapter  # the client is slow to import

    with KubernetesAdapter.connect(settings.kubernetes, opt_out_label=limits.opt_out_label,
                                   eviction=operator.policy.remediation.eviction) as adapter:
        yield operator, adapter
