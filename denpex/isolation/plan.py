"""The isolation plan: what would be done to which node, why, and what was blocked.

A plan decides; it never acts. Approvals and audit records refer to its content hash, so a plan
edited after approval no longer matches its approval. ``contract_view()`` is the ``plan`` object
of ``denpex triage --format json`` (docs/contracts.md)::

    {"recommend_isolation": true,
     "actions": [{"node": "gpu-node-002", "action": "drain"}],
     "blocked": []}
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from denpex.evidence.loading import FileKind, read_model
from denpex.isolation.errors import PlanError
from denpex.isolation.policy import (
    ActionKind,
    CheckKind,
    IsolationPolicy,
    RollbackKind,
    Scheduler,
)

__all__ = [
    "NODE_NAME_PATTERN",
    "INCIDENT_ID_PATTERN",
    "incident_id_problem",
    "Operation",
    "Gate",
    "BlockedNode",
    "NodeAction",
    "HungJob",
    "IsolationPlan",
    "canonical_json",
    "load_plan",
    "save_plan",
    "utc_now",
]

# One plain node name. Brackets, commas and spaces are refused, so a hostlist expression such as
# "gpu-node-[001-016]" can never reach scontrol and drain sixteen nodes at once.
NODE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"
# A Kubernetes label value (the taint ``denpex.io/isolated=<incident>`` carries it), which the
# API server checks: at most 63 characters, alphanumeric at both ends. It also heads the Slurm
# reason (``denpex:<incident> ...``), where ownership is matched on it.
INCIDENT_ID_PATTERN = r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"
MAX_PLAN_BYTES = 4 * 1024 * 1024
PLAN_FILE = FileKind("plan", invalid="not a valid isolation plan", hint="write plans with `denpex triage --plan-out FILE`")


def incident_id_problem(incident_id: str) -> str | None:
    """Why ``incident_id`` cannot be used, in one line; None when it can.

    ``"inc-42"`` -> None; ``"inc-42-"`` -> ``"incident id 'inc-42-' is not valid: use 1 to 63 ..."``.
    """
    if re.fullmatch(INCIDENT_ID_PATTERN, incident_id):
        return None
    return (f"incident id {incident_id!r} is not valid: use 1 to 63 characters from A-Z a-z 0-9 . _ -, "
            "starting and ending with a letter or digit (it becomes a Kubernetes taint value and "
            "starts the Slurm reason)")


def canonical_json(data: Any) -> str:
    """Sorted keys, no whitespace: the bytes that hashes are taken over."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Operation(StrEnum):
    """Which way a plan is carried out."""

    ISOLATE = "isolate"
    """Apply each action (drain / cordon)."""
    ROLLBACK = "rollback"
    """Undo each action (resume / uncordon), only where this incident owns the isolation."""
    REQUEUE = "requeue"
    """Restart the hung job away from the isolated nodes (``IsolationPlan.hung_job``): a Slurm
    requeue with those nodes excluded, or on Kubernetes deleting its pods there."""


class Gate(StrEnum):
    """The safety gate that blocked a node (or the whole plan)."""

    VERDICT = "verdict"
    """The verdict does not name a culprit (no_hang, ambiguous, incomplete without one)."""
    EVIDENCE = "evidence"
    """No hardware signal supports a fault, or it points at the application."""
    STALE_EVIDENCE = "stale_evidence"
    """The evidence is older than the policy's limit."""
    UNKNOWN_NODE = "unknown_node"
    """No host is known for the rank, or the scheduler does not know the node."""
    OPT_OUT = "opt_out"
    """The node is opted out."""
    FOREIGN_REASON = "foreign_reason"
    """Someone else already drained or cordoned the node; their reason is kept."""
    CIRCUIT_BREAKER = "circuit_breaker"
    """The blast-radius breaker is (or would be) tripped."""


class BlockedNode(BaseModel):
    """One gate's refusal, in words a person reads."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gate: Gate
    node: str | None = None
    """None when the gate blocks the whole plan."""
    message: str


class NodeAction(BaseModel):
    """What is done to one node, the checks around it and how it is undone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str = Field(pattern=NODE_NAME_PATTERN)
    action: ActionKind
    reason: str = Field(min_length=1, max_length=250)
    """Starts with ``<prefix>:<incident-id>``; written as the Slurm reason / k8s annotation."""
    ranks: tuple[int, ...] = ()
    evidence: tuple[str, ...] = ()
    """The hardware signals that support isolating this node, one line each."""
    pre_checks: tuple[CheckKind, ...]
    post_checks: tuple[CheckKind, ...]
    rollback: RollbackKind
    running_jobs: tuple[str, ...] = ()
    """Jobs seen on the node when the plan was made (re-read before acting)."""

    @field_validator("reason")
    @classmethod
    def _one_line(cls, reason: str) -> str:
        # Any text, but one line by every reckoning (splitlines also breaks at \x85, \u2028, ...).
        if reason.splitlines() != [reason] or any(ch in reason for ch in "\t\x00"):
            raise ValueError("reason must be one line of printable text")
        return reason


class HungJob(BaseModel):
    """The hung job itself. A drain waits for running jobs to end and a hung job never ends, so
    training stays down while its node is "draining"; restarting the job elsewhere is its own
    action, approved (``operation: requeue``), audited and verified like every other."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    """The Slurm job id, or the Kubernetes job name its pods carry as a label."""
    exclude_nodes: tuple[str, ...] = Field(min_length=1)
    """The isolated nodes: excluded from the requeued job (Slurm ``ExcNodeList``), or where its
    pods are deleted (Kubernetes)."""
    message: str
    """What a person reads in the plan."""

    @field_validator("exclude_nodes")
    @classmethod
    def _plain_names(cls, nodes: tuple[str, ...]) -> tuple[str, ...]:
        bad = [n for n in nodes if not re.fullmatch(NODE_NAME_PATTERN, n)]
        if bad:
            raise ValueError(f"not plain node names: {bad}")
        return nodes


class IsolationPlan(BaseModel):
    """The decision for one incident. Stable content hash: ``plan.content_hash()``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = 1
    incident_id: str
    scheduler: Scheduler
    as_of: datetime
    """The time the evidence was judged at (never the wall clock by default)."""
    job_id: str | None = None
    cluster: str | None = Field(default=None, min_length=1, max_length=200)
    """The cluster the plan was made for (Slurm ``ClusterName``, Kubernetes context). Approvals
    are bound to it, and execution refuses settings that reach another."""
    tenant: str | None = Field(default=None, min_length=1, max_length=200)
    """The tenant whose job hung; selects the runbook's approvers for prefect-ui approvals."""
    verdict: str
    actions: tuple[NodeAction, ...] = ()
    blocked: tuple[BlockedNode, ...] = ()
    breaker_trip: str | None = None
    """Set when carrying this plan out would trip the circuit breaker; the executor trips it."""
    hung_job: HungJob | None = None
    """Offered when the plan isolates nodes of a known job: see ``HungJob``."""
    facts_checked: bool = False
    """Whether cluster facts were read when planning. The executor re-reads them regardless."""
    policy: IsolationPolicy

    @field_validator("incident_id")
    @classmethod
    def _label_value(cls, incident_id: str) -> str:
        problem = incident_id_problem(incident_id)
        if problem is not None:
            raise ValueError(problem)
        return incident_id

    @field_validator("as_of")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        if value.tzinfo is None:
            raise ValueError("as_of must carry a time zone")
        return value.astimezone(UTC)

    @property
    def recommend_isolation(self) -> bool:
        return bool(self.actions)

    def content_hash(self) -> str:
        """SHA-256 over the canonical JSON of the whole plan, policy included."""
        return hashlib.sha256(canonical_json(self.model_dump(mode="json")).encode()).hexdigest()

    def action_for(self, node: str) -> NodeAction | None:
        return next((a for a in self.actions if a.node == node), None)

    def contract_view(self) -> dict[str, Any]:
        """The ``plan`` object of the triage JSON contract."""
        return {
            "recommend_isolation": self.recommend_isolation,
            "actions": [{"node": a.node, "action": a.action.value} for a in self.actions],
            "blocked": [b.message for b in self.blocked],
        }


def save_plan(plan: IsolationPlan, path: Path) -> None:
    """Write the plan as JSON (indented for review; the hash does not depend on layout)."""
    path.write_text(plan.model_dump_json(indent=2) + "\n", encoding="utf-8")


def load_plan(path: Path) -> IsolationPlan:
    """Read a plan file written by ``save_plan``; every problem is reported in one PlanError."""
    return read_model(path, IsolationPlan, max_bytes=MAX_PLAN_BYTES, kind=PLAN_FILE, error=PlanError)


def utc_now() -> datetime:
    """The wall clock in UTC; only executors and approvals use it, never planning."""
    return datetime.now(UTC)
