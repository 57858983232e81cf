"""The remediation policy: which evidence is enough, the safety limits, approval and steps.

A runbook (``runbooks/*.yaml``, ``denpex.isolation.runbook``) carries one of these. A snapshot is
stored inside every plan, so the limits a person approved are the limits the executor enforces.
Defaults are the safe side: hardware evidence required, tiny blast radius, no eviction.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, field_validator, model_validator

from denpex.analysis.models import CandidateKind

__all__ = [
    "Scheduler",
    "ActionKind",
    "RollbackKind",
    "CheckKind",
    "EvidenceRule",
    "SafetyLimits",
    "ApprovalChannel",
    "SecondFactor",
    "ApproverScope",
    "ApprovalRule",
    "EvictionRule",
    "SchedulerSteps",
    "RemediationSteps",
    "IsolationPolicy",
    "MANDATORY_CHECKS",
]


class Scheduler(StrEnum):
    """Where the nodes live."""

    SLURM = "slurm"
    """Slurm: ``scontrol``/``squeue`` over SSH on a controller or login node."""
    KUBERNETES = "kubernetes"
    """Kubernetes: the API server through the official client."""


class ActionKind(StrEnum):
    """What is done to an implicated node. DOWN is deliberately absent: it kills running jobs."""

    DRAIN = "drain"
    """Slurm ``State=DRAIN``: running jobs finish, no new job starts on the node."""
    CORDON_TAINT = "cordon_taint"
    """Kubernetes: ``spec.unschedulable`` plus a ``NoSchedule`` taint; running pods stay."""
    CORDON_TAINT_EVICT = "cordon_taint_evict"
    """Kubernetes: as ``cordon_taint``, then evict pods through the Eviction API (PDBs honoured)."""


class RollbackKind(StrEnum):
    """How an action is undone."""

    RESUME = "resume"
    """Slurm ``State=RESUME``; only on a drain whose reason this incident owns."""
    UNCORDON = "uncordon"
    """Kubernetes: clear ``unschedulable``, remove our taint and annotations."""


class CheckKind(StrEnum):
    """A check run before (pre) or after (post) an action."""

    NODE_EXISTS = "node_exists"
    """The scheduler knows the node by exactly this name."""
    NOT_OPTED_OUT = "not_opted_out"
    """The node is not on the opt-out list and carries no opt-out label."""
    REASON_NOT_FOREIGN = "reason_not_foreign"
    """The node is not already drained or cordoned by someone else."""
    BREAKER_CLOSED = "breaker_closed"
    """The circuit breaker has not been tripped (or a person has reset it)."""
    WITHIN_BLAST_RADIUS = "within_blast_radius"
    """Per-incident node count and partition/cluster share stay inside the limits."""
    LIST_RUNNING_JOBS = "list_running_jobs"
    """Record which jobs or pods still run on the node (they keep running under DRAIN)."""
    STATE_SHOWS_ISOLATED = "state_shows_isolated"
    """After acting: Slurm shows the DRAIN flag / Kubernetes shows unschedulable plus our taint."""
    REASON_IS_OURS = "reason_is_ours"
    """After acting: the recorded reason is this incident's."""


MANDATORY_CHECKS: frozenset[CheckKind] = frozenset(
    {
        CheckKind.NODE_EXISTS,
        CheckKind.NOT_OPTED_OUT,
        CheckKind.REASON_NOT_FOREIGN,
        CheckKind.BREAKER_CLOSED,
        CheckKind.WITHIN_BLAST_RADIUS,
    }
)
"""Pre-checks a runbook may not leave out: they are the safety gates."""

DEFAULT_CHECKS: tuple[CheckKind, ...] = (
    CheckKind.NODE_EXISTS,
    CheckKind.NOT_OPTED_OUT,
    CheckKind.REASON_NOT_FOREIGN,
    CheckKind.BREAKER_CLOSED,
    CheckKind.WITHIN_BLAST_RADIUS,
    CheckKind.LIST_RUNNING_JOBS,
)


_T = TypeVar("_T", str, CandidateKind)

# Sets serialize sorted: set iteration order changes between processes (string hashing is
# randomized), and the plan's content hash must not.
SortedSet = Annotated[frozenset[_T], PlainSerializer(lambda items: sorted(items), return_type=list)]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EvidenceRule(_Frozen):
    """When a candidate's node may be isolated at all."""

    hardware_signal_required_for: SortedSet[CandidateKind] = frozenset(CandidateKind)
    """Candidate kinds that need a fresh hardware signal with bearing ``supports_hardware_fault``."""
    never_isolate_for: SortedSet[CandidateKind] = frozenset({CandidateKind.MISMATCH})
    """Kinds that point at the program (a mismatched collective), never at a node."""
    max_age: timedelta = timedelta(hours=1)
    """Evidence (the triage's as-of and each hardware signal) older than this is stale."""
    clock_skew: timedelta = timedelta(minutes=5)
    """How far a signal may lie after the as-of time and still count (clocks differ)."""

    @field_validator("max_age", "clock_skew")
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError(f"must be a positive duration, got {value}")
        return value


class SafetyLimits(_Frozen):
    """The blast-radius circuit breaker's limits, and the nodes never touched."""

    max_nodes_per_incident: int = Field(default=2, ge=1)
    """Nodes one incident may isolate in all, counting those its earlier plans already isolate."""
    max_isolated_fraction: float = Field(default=0.10, gt=0.0, le=1.0)
    """Share of a partition, and of the cluster, that may be isolated, counting drains by anyone."""
    opt_out_nodes: SortedSet[str] = frozenset()
    opt_out_label: str = "denpex.io/opt-out"
    """Kubernetes node label (value ``"true"``) that excludes a node."""
    opt_out_feature: str = "denpex_opt_out"
    """Slurm node feature (``AvailableFeatures``) that excludes a node."""
    max_isolations_per_cluster_per_hour: int = Field(default=4, ge=1)
    """Nodes Denpex may isolate on one cluster within any hour, across every incident. One bad
    switch or rack opens many incidents, each within its own limits; this stops the storm. The
    breaker enforces it, and trips when a run would exceed it."""


class ApprovalChannel(StrEnum):
    """How a person's consent reached Denpex."""

    CLI_SIGNED = "cli-signed"
    """``denpex approve --key``: an ed25519 signature checked against the operator's trusted keys."""
    PREFECT_UI = "prefect-ui"
    """A person resumed the paused flow run in the Prefect UI; trusted as far as the Prefect API's
    authentication is, so the runbook decides whether it is accepted at all."""
    APPROVAL_PAGE = "approval-page"
    """A person decided on Denpex's approval page (``denpex serve-approvals``), proved by their
    second factor there; the page signs the decision (ed25519) for one run and one plan."""


class SecondFactor(StrEnum):
    """What proves the person behind an approval made in a browser. ``totp`` and ``proxy`` are
    proved on the approval page; only ``none`` leaves the answer to the Prefect form."""

    TOTP = "totp"
    """The approver's current one-time code (RFC 6238), enrolled with ``denpex approver enroll``,
    typed on the approval page (never into Prefect, where every API user could read it)."""
    PROXY = "proxy"
    """The identity an authenticating proxy (oauth2-proxy and the like) puts in a header of its
    requests to the approval page, trusted only from the proxy addresses the page is given."""
    NONE = "none"
    """Nothing beyond the Prefect API's own authentication: the Prefect form, for a single trusted
    operator (anyone who reaches the API may type a name, or flip an answer)."""


class ApproverScope(_Frozen):
    """Approvers for one tenant and cluster (``"*"`` matches any)."""

    tenant: str = "*"
    cluster: str = "*"
    names: SortedSet[str]

    def covers(self, tenant: str | None, cluster: str | None) -> bool:
        return self.tenant in ("*", tenant) and self.cluster in ("*", cluster)


class ApprovalRule(_Frozen):
    """Who may approve, through which channels, for how long, and how old a plan may get."""

    approvers: SortedSet[str] = frozenset()
    """Approvers for every tenant and cluster. With ``scoped`` empty too, any person whose key
    the operator trusts may approve through ``cli-signed``, and nobody through ``prefect-ui``."""
    scoped: tuple[ApproverScope, ...] = ()
    """Approvers for one tenant and/or cluster, added to ``approvers`` there."""
    channels: Annotated[frozenset[ApprovalChannel], PlainSerializer(lambda items: sorted(items), return_type=list)] \
        = frozenset({ApprovalChannel.CLI_SIGNED, ApprovalChannel.PREFECT_UI})
    """Channels accepted. ``approval-page`` and ``prefect-ui`` approvals also need a name in
    ``approvers`` (or ``scoped``) for the tenant and cluster. The default is what it was before the
    approval page existed, so that plans saved under the built-in policy keep their hash; a runbook
    names ``approval-page`` to take the page's decisions (the shipped runbooks do)."""
    second_factor: SecondFactor = SecondFactor.TOTP
    """How a person proves who they are when approving a paused run. The default, ``totp``, and
    ``proxy`` send the approver to the approval page (``approval-page``); ``none`` keeps the Prefect
    form (``prefect-ui``) and trusts the Prefect API's authentication alone."""
    ttl: timedelta = timedelta(hours=1)
    max_plan_age: timedelta = timedelta(hours=6)
    """A plan whose evidence is older than this (by the wall clock) is not executed."""

    def approvers_for(self, tenant: str | None, cluster: str | None) -> frozenset[str]:
        """The names that may approve on ``tenant``'s ``cluster``; empty: no list applies."""
        names = set(self.approvers)
        for scope in self.scoped:
            if scope.covers(tenant, cluster):
                names |= scope.names
        return frozenset(names)


class EvictionRule(_Frozen):
    """Which pods ``cordon_taint_evict`` may evict, as ``kubectl drain`` decides by default.

    Pods that nothing recreates (no controller), pods with ``emptyDir`` data (lost on eviction),
    DaemonSet pods (recreated on the same node) and mirror pods (the kubelet's) are left alone
    unless a flag here says otherwise, like ``kubectl drain --force`` / ``--delete-emptydir-data``.
    """

    evict_unmanaged: bool = False
    """Evict pods without a controller (``kubectl drain --force``): they are gone for good."""
    delete_emptydir_data: bool = False
    """Evict pods with ``emptyDir`` volumes, losing that data (``--delete-emptydir-data``)."""


class SchedulerSteps(_Frozen):
    """Check, act, verify and roll back, for one scheduler."""

    check: tuple[CheckKind, ...]
    act: ActionKind
    verify: tuple[CheckKind, ...]
    rollback: RollbackKind

    @model_validator(mode="after")
    def _safety_checks_present(self) -> SchedulerSteps:
        missing = sorted(MANDATORY_CHECKS - set(self.check))
        if missing:
            raise ValueError(
                "check must include the safety gates; missing: " + ", ".join(missing)
            )
        return self


class RemediationSteps(_Frozen):
    """Steps per scheduler."""

    slurm: SchedulerSteps = SchedulerSteps(
        check=DEFAULT_CHECKS,
        act=ActionKind.DRAIN,
        verify=(CheckKind.STATE_SHOWS_ISOLATED, CheckKind.REASON_IS_OURS),
        rollback=RollbackKind.RESUME,
    )
    kubernetes: SchedulerSteps = SchedulerSteps(
        check=DEFAULT_CHECKS,
        act=ActionKind.CORDON_TAINT,
        verify=(CheckKind.STATE_SHOWS_ISOLATED, CheckKind.REASON_IS_OURS),
        rollback=RollbackKind.UNCORDON,
    )
    eviction: EvictionRule = EvictionRule()
    """What ``cordon_taint_evict`` may evict on Kubernetes."""

    @model_validator(mode="after")
    def _actions_fit_schedulers(self) -> RemediationSteps:
        problems = []
        if self.slurm.act is not ActionKind.DRAIN or self.slurm.rollback is not RollbackKind.RESUME:
            problems.append("slurm must act 'drain' and roll back 'resume'")
        if self.kubernetes.act is ActionKind.DRAIN or self.kubernetes.rollback is not RollbackKind.UNCORDON:
            problems.append("kubernetes must act 'cordon_taint' or 'cordon_taint_evict' and roll back 'uncordon'")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def for_scheduler(self, scheduler: Scheduler) -> SchedulerSteps:
        return self.slurm if scheduler is Scheduler.SLURM else self.kubernetes


class IsolationPolicy(_Frozen):
    """Everything that decides whether and how a node is isolated."""

    reason_prefix: str = Field(default="denpex", pattern=r"^[a-z][a-z0-9-]{1,30}$")
    """Reasons we own start with ``<prefix>:<incident-id>``."""
    evidence: EvidenceRule = EvidenceRule()
    limits: SafetyLimits = SafetyLimits()
    approval: ApprovalRule = ApprovalRule()
    remediation: RemediationSteps = RemediationSteps()
