"""``plan_isolation``: from a triage result to an isolation plan. Decides; never acts."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from denpex.analysis.models import TriageResult
from denpex.evidence.manifest import JobManifest
from denpex.isolation.breaker import BreakerState
from denpex.isolation.errors import PlanError
from denpex.isolation.facts import ClusterFacts, ReasonOwner, owned_reason_prefix
from denpex.isolation.gates import NodeProposal, blast_radius_gate, evidence_gate, node_gate
from denpex.isolation.plan import BlockedNode, HungJob, IsolationPlan, NodeAction, incident_id_problem, utc_now
from denpex.isolation.policy import IsolationPolicy, Scheduler
from denpex.isolation.runbook import load_runbook

__all__ = ["plan_isolation", "plan_for_triage", "default_incident_id", "reason_for", "hung_job_for"]

_MAX_REASON = 250


def reason_for(policy: IsolationPolicy, incident_id: str, proposal: NodeProposal) -> str:
    """The reason we own, e.g. ``denpex:inc-42 rank 1: xid 79 at 2026-11-29T18:45:02Z ...``.

    Kept to one line and 250 characters (the cut falls inside the evidence text, never inside
    the ``denpex:<incident>`` prefix that ownership checks rely on).
    """
    ranks = ",".join(str(r) for r in proposal.ranks)
    label = "rank" if len(proposal.ranks) == 1 else "ranks"
    head = f"{owned_reason_prefix(policy.reason_prefix, incident_id)} {label} {ranks}"
    detail = "; ".join(proposal.evidence) or "isolated by policy without a hardware signal"
    text = " ".join(f"{head}: {detail}".split())  # one line, single spaces
    return text if len(text) <= _MAX_REASON else text[: _MAX_REASON - 3] + "..."


def plan_isolation(
    result: TriageResult,
    manifest: JobManifest | None,
    policy: IsolationPolicy,
    cluster_facts: ClusterFacts | None,
    scheduler: Scheduler,
    incident_id: str,
    as_of: datetime,
    *,
    breaker: BreakerState | None = None,
    cluster: str | None = None,
    tenant: str | None = None,
    job_id: str | None = None,
) -> IsolationPlan:
    """Decide which nodes to isolate for one incident, and why the others are not.

    ``cluster_facts`` may be None when planning offline (``denpex triage`` without cluster
    access): the node and blast-radius gates that need live state then run at execution time.
    ``breaker`` is the circuit breaker's current state; a tripped breaker blocks every action.
    ``cluster`` (and ``tenant``) are recorded: approvals bind to the plan's cluster.
    Raises PlanError for an ``incident_id`` that is not a Kubernetes label value.
    """
    problem = incident_id_problem(incident_id)
    if problem is not None:
        raise PlanError(problem)
    decision = evidence_gate(result, manifest, policy.evidence, as_of)
    blocked: list[BlockedNode] = list(decision.blocked)
    passed: list[NodeProposal] = []
    for proposal in decision.proposals:
        block = node_gate(proposal.node, cluster_facts, policy.limits, policy.reason_prefix, incident_id)
        if block is None:
            passed.append(proposal)
        else:
            blocked.append(block)

    def already_ours(node: str) -> bool:
        return cluster_facts is not None and (
            cluster_facts.node(node).owner(policy.reason_prefix, incident_id) is ReasonOwner.THIS_INCIDENT
        )

    radius = blast_radius_gate(
        [p.node for p in passed if not already_ours(p.node)],
        cluster_facts,
        policy.limits,
        breaker or BreakerState(),
        incident_nodes=[n for n in (cluster_facts.nodes if cluster_facts else {}) if already_ours(n)],
    )
    if radius.blocked:
        blocked.extend(radius.blocked)
        passed = []

    steps = policy.remediation.for_scheduler(scheduler)
    actions = tuple(
        NodeAction(
            node=p.node,
            action=steps.act,
            reason=reason_for(policy, incident_id, p),
            ranks=p.ranks,
            evidence=p.evidence,
            pre_checks=steps.check,
            post_checks=steps.verify,
            rollback=steps.rollback,
            running_jobs=cluster_facts.node(p.node).running_jobs if cluster_facts else (),
        )
        for p in passed
    )
    job_id = (manifest.job_id if manifest else None) or job_id
    return IsolationPlan(
        hung_job=hung_job_for(job_id, [a.node for a in actions], scheduler),
        incident_id=incident_id,
        scheduler=scheduler,
        as_of=as_of,
        job_id=job_id,
        cluster=cluster,
        tenant=tenant,
        verdict=result.verdict.value,
        actions=actions,
        blocked=tuple(blocked),
        breaker_trip=radius.trip_reason,
        facts_checked=cluster_facts is not None,
        policy=policy,
    )


def hung_job_for(job_id: str | None, nodes: list[str], scheduler: Scheduler) -> HungJob | None:
    """The hung-job action for ``job_id`` once ``nodes`` are isolated; None without either."""
    if not job_id or not nodes or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", job_id) is None:
        return None
    where = ", ".join(nodes)
    if scheduler is Scheduler.SLURM:
        message = (f"job {job_id} is hung and never ends, so a DRAIN of {where} waits forever and training "
                   f"stays down; approve `--operation requeue` to requeue it with {where} excluded "
                   "(ExcNodeList)")
    else:
        message = (f"the pods of job {job_id} on {where} are hung and keep running on the cordoned node; "
                   "approve `--operation requeue` to delete them there so that their controller "
                   "reschedules them elsewhere")
    return HungJob(job_id=job_id, exclude_nodes=tuple(nodes), message=message)


def default_incident_id(result: TriageResult, job_id: str | None = None) -> str:
    """Deterministic, so re-running triage on the same evidence yields the same plan hash.

    ``job-123`` judged as of 2026-11-29T18:45:02Z -> ``job-123-20261129T184502Z``.
    """
    stamp = (result.as_of or utc_now()).strftime("%Y%m%dT%H%M%SZ")
    # ASCII only: str.isalnum() also accepts letters such as "é" that no label value may hold.
    head = "".join(ch if ch.isascii() and ch.isalnum() or ch in "._-" else "-" for ch in (job_id or "inc"))
    return f"{head[:40].strip('-._') or 'inc'}-{stamp}"


def plan_for_triage(
    result: TriageResult,
    scheduler: Scheduler,
    *,
    incident_id: str | None = None,
    runbook: Path | None = None,
    job_id: str | None = None,
    cluster: str | None = None,
    manifest: JobManifest | None = None,
) -> IsolationPlan:
    """The plan ``denpex triage --scheduler`` prints. Offline: no cluster facts, no breaker state;
    ``denpex isolate`` re-runs those gates on live facts before acting. ``manifest`` tells the
    gates which hosts are derived (a guess that needs its node's own signal)."""
    policy = load_runbook(runbook).policy() if runbook else IsolationPolicy()
    return plan_isolation(
        result, manifest, policy, None, scheduler,
        incident_id or default_incident_id(result, job_id), result.as_of or utc_now(), cluster=cluster,
        job_id=job_id,
    )
