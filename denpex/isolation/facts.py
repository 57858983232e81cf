"""What the cluster says about its nodes, read before deciding and after acting.

Facts come from ``scontrol show node`` / ``squeue`` (``denpex.isolation.slurm_parse``) or from the
Kubernetes API (``denpex.isolation.kubernetes``). Gates and the executor decide on these values;
they never re-read raw command output.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ReasonOwner", "NodeFacts", "ClusterFacts", "reason_owner", "owned_reason_prefix"]


class ReasonOwner(StrEnum):
    """Who owns a node's current isolation (its drain reason or cordon annotation)."""

    NONE = "none"
    """The node is not isolated."""
    THIS_INCIDENT = "this_incident"
    """Isolated by this very incident: acting again is a no-op, rolling back is allowed."""
    OTHER_INCIDENT = "other_incident"
    """Isolated by Denpex for another incident: counted, never overwritten or undone."""
    SOMEONE_ELSE = "someone_else"
    """Isolated by a person or another tool (or with no reason): never overwritten or undone."""


def owned_reason_prefix(prefix: str, incident_id: str) -> str:
    """The start of every reason this incident writes, e.g. ``denpex:inc-42``."""
    return f"{prefix}:{incident_id}"


def reason_owner(isolated: bool, reason: str | None, prefix: str, incident_id: str, *,
                 set_by_other_user: bool = False) -> ReasonOwner:
    """Classify an isolation by its reason text, and by who set it where the scheduler says so.

    A reason in our words set by another user (``set_by_other_user``: a person who copied it, or
    another tool) is not ours: Denpex never undoes it.

    >>> reason_owner(True, "denpex:inc-42 rank 1 Xid 79", "denpex", "inc-42")
    <ReasonOwner.THIS_INCIDENT: 'this_incident'>
    >>> reason_owner(True, "denpex:inc-7 rank 3", "denpex", "inc-42")
    <ReasonOwner.OTHER_INCIDENT: 'other_incident'>
    >>> reason_owner(True, "bad DIMM, ticket 881", "denpex", "inc-42")
    <ReasonOwner.SOMEONE_ELSE: 'someone_else'>
    """
    if not isolated:
        return ReasonOwner.NONE
    if set_by_other_user:
        return ReasonOwner.SOMEONE_ELSE
    text = (reason or "").strip()
    ours = owned_reason_prefix(prefix, incident_id)
    # The incident id must end at a space (or the end): "denpex:inc-4" must not own "denpex:inc-42".
    if text == ours or text.startswith(ours + " "):
        return ReasonOwner.THIS_INCIDENT
    if re.match(rf"{re.escape(prefix)}:\S+", text):
        return ReasonOwner.OTHER_INCIDENT
    return ReasonOwner.SOMEONE_ELSE


class NodeFacts(BaseModel):
    """One node as the scheduler reports it."""

    model_config = ConfigDict(frozen=True)

    name: str
    exists: bool = True
    state: str = ""
    """The scheduler's own words, e.g. ``MIXED+DRAIN`` or ``Ready,SchedulingDisabled``."""
    isolated: bool = False
    """Drained/down (Slurm) or unschedulable (Kubernetes)."""
    down: bool = False
    not_responding: bool = False
    reason: str | None = None
    """Drain reason without Slurm's ``[user@time]`` suffix, or our Kubernetes annotation."""
    reason_user: str | None = None
    """Who set the reason (Slurm's ``[user@time]``), where the scheduler says."""
    reason_set_by_other_user: bool = False
    """The scheduler names a user other than the one Denpex acts as: the isolation is not ours."""
    partitions: tuple[str, ...] = ()
    running_jobs: tuple[str, ...] = ()
    """Job ids (Slurm) or ``namespace/pod`` (Kubernetes) still running on the node."""
    opted_out: bool = False
    """The node carries the opt-out label or feature."""
    overridden_by: str | None = None
    """A person undid an earlier Denpex isolation by hand (Kubernetes: uncordoned a node that
    still carries our annotations). A manual uncordon cancels the automated workflow."""
    evictable_pods: tuple[str, ...] = ()
    """Kubernetes: pods the runbook's eviction rules would evict (``namespace/pod``)."""
    terminating_pods: tuple[str, ...] = ()
    """Kubernetes: such pods already evicted or deleted but not yet gone; a drain waits for them
    (``kubectl drain`` does): until then they still hold the GPUs and the job's place."""
    marked_by: str | None = None
    """Kubernetes: the incident our annotations name, isolated or not (None: no marks of ours)."""
    taints: tuple[str, ...] = ()
    """Kubernetes taints as ``key=value:Effect``."""

    def owner(self, prefix: str, incident_id: str) -> ReasonOwner:
        return reason_owner(self.isolated, self.reason, prefix, incident_id,
                            set_by_other_user=self.reason_set_by_other_user)


class ClusterFacts(BaseModel):
    """Every node the scheduler knows, read at one moment."""

    model_config = ConfigDict(frozen=True)

    nodes: dict[str, NodeFacts] = Field(default_factory=dict)
    collected_at: datetime | None = None

    def node(self, name: str) -> NodeFacts:
        """The node's facts; an unknown name gives ``exists=False`` rather than an error."""
        return self.nodes.get(name) or NodeFacts(name=name, exists=False)

    def partitions(self) -> dict[str, tuple[str, ...]]:
        """Partition (or node pool) name to its nodes, in name order."""
        members: dict[str, list[str]] = {}
        for facts in self.nodes.values():
            for partition in facts.partitions:
                members.setdefault(partition, []).append(facts.name)
        return {p: tuple(sorted(names)) for p, names in sorted(members.items())}

    def isolated_nodes(self) -> frozenset[str]:
        """Nodes already drained, down or cordoned, by anyone."""
        return frozenset(n for n, f in self.nodes.items() if f.isolated or f.down)
