"""Plan tiers, and which of them may use cluster-wide hang triage (Data Center only)."""

from __future__ import annotations

from enum import StrEnum

from denpex.ingest.errors import ForbiddenError

__all__ = ["PlanTier", "require_hang_triage"]


class PlanTier(StrEnum):
    """A tenant's plan. Only ``DATA_CENTER`` includes cluster-wide hang triage."""

    FREE = "free"
    """Single-job tooling only."""
    TEAM = "team"
    """Small teams; no cluster-wide workflows."""
    SCALE = "scale"
    """Larger jobs; no cluster-wide workflows."""
    GROWTH = "growth"
    """Everything but cluster-wide triage and isolation."""
    DATA_CENTER = "data-center"
    """Cluster-wide hang triage, evidence ingest and isolation."""

    @property
    def allows_hang_triage(self) -> bool:
        return self is PlanTier.DATA_CENTER


def require_hang_triage(tenant: str, plan: PlanTier) -> None:
    """Refuse (403) a tenant whose plan does not include this workflow."""
    if not plan.allows_hang_triage:
        raise ForbiddenError(f"tenant {tenant!r} is on the {plan.value} plan; cluster-wide hang triage "
                             "(evidence uploads and alerts) needs the data-center plan")
