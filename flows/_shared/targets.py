"""The cluster a run acts on: one ``Target`` carries its identity (scheduler, settings, name and
registered owner) from the block lookup to the adapter, under one name, ``cluster``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.exceptions import ObjectAlreadyExists

from blocks.targets import DenpexKubernetesTarget, DenpexSlurmTarget, block_name_for
from denpex.isolation.cluster_secrets import SECRETS_ENV, cluster_secrets_dir
from denpex.isolation.config import IsolationSettings
from denpex.isolation.errors import ConfigError
from denpex.isolation.policy import Scheduler
from denpex.tenancy import judge_target, read_ownership
from flows._shared.run import load_block, state_dir

__all__ = ["Target", "TargetLookup", "find_target", "remediation_limit", "ensure_limit"]


@dataclass(frozen=True)
class Target:
    """The cluster to act on, as its block describes it."""

    scheduler: Scheduler
    settings: IsolationSettings
    cluster: str
    tenant: str | None = None
    """The cluster's owner in the operator's registry (None: no registered owner, no tenant scoping)."""


@dataclass(frozen=True)
class TargetLookup:
    """What ``find_target`` found: a usable target, or why a registered one may not be used."""

    target: Target | None
    refused: str | None = None
    note: str = ""

    def target_or_raise(self, cluster: str) -> Target:
        """The target, else ValueError saying why there is none."""
        if self.target is None:
            raise ValueError(self.refused or f"no Slurm or Kubernetes target block is registered for cluster "
                                             f"{cluster!r}")
        return self.target


def find_target(cluster: str, runbook: Path, *, tenant: str | None) -> TargetLookup:
    """The Slurm or Kubernetes target block named after ``cluster`` (no target when none is
    registered), usable only when it names ``cluster`` exactly and the operator's registry in the
    state directory does not give that cluster to a tenant other than ``tenant`` (None: any).
    The target's tenant is the registry's owner, never the parameter's (``denpex.tenancy``).

    The executor's settings name the runbook file, so execution enforces the operator's policy.
    Where the audit log's copy is kept is not among them: the operator's configuration names it
    (``DENPEX_AUDIT_STORE``), never a block, a parameter or the incident's evidence folder.
    """
    name = block_name_for(cluster)
    block: DenpexSlurmTarget | DenpexKubernetesTarget | None = load_block(DenpexSlurmTarget, name)
    scheduler = Scheduler.SLURM
    if block is None:
        block, scheduler = load_block(DenpexKubernetesTarget, name), Scheduler.KUBERNETES
    if block is None:
        return TargetLookup(None)
    decision = judge_target(read_ownership(state_dir(), cluster), tenant=tenant, block_cluster=block.cluster_name)
    if not decision.allowed:
        return TargetLookup(None, refused=decision.reason)
    # Settings are made (key files written) only for a target that may be used. A credential in
    # the block where the worker keeps its own, or none anywhere, refuses the target: the triage
    # still reports, and nothing connects.
    try:
        settings = block.settings(state_dir(), runbook, os.environ)
        own_folder = cluster_secrets_dir(os.environ) is not None
    except ConfigError as exc:
        return TargetLookup(None, refused=str(exc))
    exposed = "" if own_folder else (f"the target block carries cluster {cluster!r}'s credential, which Prefect gives "
                                     f"to any API client that asks: keep it in the workers' {SECRETS_ENV} folder")
    return TargetLookup(Target(scheduler, settings, block.cluster_name, decision.tenant),
                        note="; ".join(n for n in (decision.reason, exposed) if n))


def remediation_limit(cluster: str) -> str:
    """The global concurrency limit that keeps one cluster's remediation to one run at a time."""
    return f"denpex-remediation-{block_name_for(cluster)}"


def ensure_limit(name: str) -> None:
    """Create the limit (one slot) if it does not exist yet; Prefect only honours existing limits."""
    with get_client(sync_client=True) as client:
        try:
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=name, limit=1))
        except ObjectAlreadyExists:
            pass
