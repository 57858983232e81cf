"""Which tenant owns a cluster, as the operator's ingest registry records it, and what follows.

A cluster belongs to exactly one tenant. That ownership lives in the ``clusters`` table of the
ingest registry in ``$DENPEX_STATE_DIR`` (``denpex.ingest.registry`` writes it when a tenant's
first key or token for the cluster is made, or with ``denpex clusters add``), never in a Block,
a flow parameter or a plan: those are editable by whoever reaches the Prefect API or the file.

Reading here is read-only (the flow process and ``denpex isolate`` share the state directory
with ``denpex serve-api``, which alone writes it). Deciding is kept apart from reading:
``read_ownership`` reads; ``judge_target`` and ``execution_tenant`` are pure.

Two names are one cluster when they make one block name: ``cluster_slug("gpu.prod")``,
``cluster_slug("GPU_Prod")`` and ``cluster_slug("gpu prod")`` are all ``"gpu-prod"``, so the
registry refuses the second spelling for any tenant.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from denpex.state_paths import INGEST_DATABASE

__all__ = ["cluster_slug", "OwnershipState", "ClusterOwnership", "read_ownership",
           "TenancyDecision", "judge_target", "execution_tenant", "NO_SCOPING_NOTE"]

NO_SCOPING_NOTE = "no tenant scoping applied"


def cluster_slug(cluster: str) -> str:
    """The block name (lowercase letters, digits, dashes) a cluster name makes.

    ``"lab"`` -> ``"lab"``; ``"Prod East/1"`` -> ``"prod-east-1"``; ``"GPU_Prod"`` -> ``"gpu-prod"``.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", cluster.lower()).strip("-")
    return slug or "default"


class OwnershipState(StrEnum):
    """What the registry says about one cluster name."""

    OWNED = "owned"
    """One tenant holds the cluster (``tenant``), under the exact name ``registered_as``."""
    UNREGISTERED = "unregistered"
    """No registry, or no tenant holds this name or any spelling of it: single-tenant use, no
    tenant scoping applies."""
    CONTESTED = "contested"
    """Keys made before ownership existed name it for several tenants (or spellings); nothing
    may act on it until the operator revokes all but one tenant's keys and tokens."""
    UNMIGRATED = "unmigrated"
    """The registry predates cluster ownership: its owner cannot be told yet."""


@dataclass(frozen=True, slots=True)
class ClusterOwnership:
    """The registry's word on ``cluster``."""

    cluster: str
    state: OwnershipState
    tenant: str | None = None
    registered_as: str | None = None
    detail: str = ""
    """For CONTESTED: who claims it."""


def read_ownership(state_dir: Path, cluster: str) -> ClusterOwnership:
    """Read the owner of ``cluster`` (matched by its block-name slug) without writing anything."""
    path = state_dir / INGEST_DATABASE
    if not path.exists():
        return ClusterOwnership(cluster, OwnershipState.UNREGISTERED)
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=30)
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        row = None
        if "clusters" in tables:
            row = db.execute("SELECT name, tenant, contested_by FROM clusters WHERE slug = ?",
                             (cluster_slug(cluster),)).fetchone()
        if row is None:
            # Keys or tokens that name the cluster without an ownership row come from before
            # ownership existed: that must not read as "nobody owns it".
            named = _key_clusters(db, tables)
            unmigrated = any(cluster_slug(name) == cluster_slug(cluster) for name in named)
            return ClusterOwnership(cluster, OwnershipState.UNMIGRATED if unmigrated
                                    else OwnershipState.UNREGISTERED)
    finally:
        db.close()
    name, tenant, contested_by = row
    if tenant is None:
        return ClusterOwnership(cluster, OwnershipState.CONTESTED, registered_as=name, detail=contested_by or "")
    return ClusterOwnership(cluster, OwnershipState.OWNED, tenant=tenant, registered_as=name)


def _key_clusters(db: sqlite3.Connection, tables: set[str]) -> set[str]:
    """The cluster names of the active keys and tokens."""
    found: set[str] = set()
    for table in ("keys", "tokens"):
        if table in tables:
            found |= {row[0] for row in db.execute(f"SELECT DISTINCT cluster FROM {table} WHERE revoked_at IS NULL")}
    return found


@dataclass(frozen=True, slots=True)
class TenancyDecision:
    """Whether to go on, for which tenant (None: no tenant scoping), and why (or a note)."""

    allowed: bool
    tenant: str | None
    reason: str


def _unusable(ownership: ClusterOwnership) -> str | None:
    if ownership.state is OwnershipState.CONTESTED:
        return (f"cluster {ownership.cluster!r} is contested in the operator's registry "
                f"({ownership.detail}); a cluster belongs to one tenant: revoke the other tenants' keys "
                "and tokens for it (`denpex keys revoke`, `denpex tokens revoke`)")
    if ownership.state is OwnershipState.UNMIGRATED:
        return (f"the operator's registry predates cluster ownership, so the owner of {ownership.cluster!r} "
                "is unknown; run `denpex clusters list` once to migrate it")
    return None


def judge_target(ownership: ClusterOwnership, *, tenant: str | None, block_cluster: str) -> TenancyDecision:
    """May the incident of ``tenant`` on ``ownership.cluster`` use a target block for ``block_cluster``?

    The block must name the incident's cluster exactly (a block is found by slug, and
    ``GPU_Prod`` and ``gpu.prod`` share one), and the registry must not give the cluster to
    another tenant (``tenant`` None: whoever the registry says). The plan's tenant is then the
    registry's owner, never the parameter's.
    """
    cluster = ownership.cluster
    if block_cluster != cluster:
        return TenancyDecision(False, None, f"the target block {cluster_slug(cluster)!r} is for cluster "
                                            f"{block_cluster!r}, not the incident's {cluster!r}; a target "
                                            "acts only on the exact cluster it names")
    unusable = _unusable(ownership)
    if unusable:
        return TenancyDecision(False, None, unusable)
    if ownership.state is OwnershipState.UNREGISTERED:
        return TenancyDecision(True, None, f"cluster {cluster!r} has no registered owner: {NO_SCOPING_NOTE}")
    if tenant is not None and ownership.tenant != tenant:
        return TenancyDecision(False, ownership.tenant, _foreign(ownership, tenant))
    if ownership.registered_as != cluster:
        return TenancyDecision(False, ownership.tenant, f"cluster {cluster!r} is registered as "
                                                        f"{ownership.registered_as!r}; use that exact name")
    return TenancyDecision(True, ownership.tenant, f"cluster {cluster!r} belongs to tenant {ownership.tenant!r}")


def execution_tenant(ownership: ClusterOwnership, plan_tenant: str | None) -> TenancyDecision:
    """The tenant whose approvers apply at execution: the registry's owner of the reached cluster.

    A plan naming another tenant is refused; a plan naming none (every CLI plan) takes the owner.
    With no registered owner, nothing is scoped (the plan's word is not trusted for it).
    """
    unusable = _unusable(ownership)
    if unusable:
        return TenancyDecision(False, None, unusable)
    if ownership.state is OwnershipState.UNREGISTERED:
        return TenancyDecision(True, None, f"cluster {ownership.cluster!r} has no registered owner in the "
                                           f"ingest registry: {NO_SCOPING_NOTE}")
    if plan_tenant is not None and plan_tenant != ownership.tenant:
        return TenancyDecision(False, ownership.tenant, _foreign(ownership, plan_tenant, "the plan's"))
    return TenancyDecision(True, ownership.tenant, f"approvers of tenant {ownership.tenant!r} apply")


def _foreign(ownership: ClusterOwnership, tenant: str, whose: str = "the incident's") -> str:
    name = ownership.registered_as
    spelled = "" if name == ownership.cluster else f" (registered as {name!r})"
    return (f"cluster {ownership.cluster!r}{spelled} belongs to tenant {ownership.tenant!r} in the operator's "
            f"registry, not to {whose} tenant {tenant!r}")
