"""The safety gates, as pure functions of the triage, the policy and the cluster facts.

Each gate that refuses a node returns a ``BlockedNode`` whose message a person can act on. The
planner runs them to decide; the executor runs the node and blast-radius gates again on fresh
facts right before acting, because the cluster may have changed since the plan was approved.

Gates, in order:
1. verdict and evidence (``evidence_gate``): a culprit must be named, its host known, and,
   for the kinds the policy lists, a fresh hardware signal must support a fault on that host;
2. node (``node_gate``): known to the scheduler, not opted out, not isolated by someone else;
3. blast radius (``blast_radius_gate``): the breaker is closed and the incident stays within the
   per-incident count and the partition/cluster share, counting nodes isolated by anyone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from denpex.analysis.wording import ranks_phrase
from denpex.analysis.models import (
    Candidate,
    CandidateHardware,
    CandidateKind,
    HardwareBearing,
    Membership,
    TriageResult,
    Verdict,
)
from denpex.evidence.manifest import JobManifest
from denpex.hardware.xid_catalog import default_xid_catalog
from denpex.isolation.breaker import BreakerState
from denpex.isolation.facts import ClusterFacts, ReasonOwner
from denpex.isolation.plan import BlockedNode, Gate
from denpex.isolation.policy import EvidenceRule, SafetyLimits

__all__ = [
    "NodeProposal",
    "EvidenceDecision",
    "RadiusDecision",
    "evidence_gate",
    "node_gate",
    "blast_radius_gate",
    "describe_signal",
    "human_duration",
]

_KIND_PHRASE = {
    CandidateKind.STOPPED_REPORTING: "stopped reporting",
    CandidateKind.STALLED: "is stalled in another operation",
    CandidateKind.NOT_ENTERED: "never entered the collective",
    CandidateKind.MISMATCH: "called a mismatched collective",
}


@dataclass(frozen=True)
class NodeProposal:
    """A node the evidence implicates, before the node and blast-radius gates."""

    node: str
    ranks: tuple[int, ...]
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class EvidenceDecision:
    proposals: list[NodeProposal] = field(default_factory=list)
    blocked: list[BlockedNode] = field(default_factory=list)


@dataclass(frozen=True)
class RadiusDecision:
    blocked: list[BlockedNode] = field(default_factory=list)
    trip_reason: str | None = None
    """Set when these isolations would exceed a limit: the breaker must trip."""


def human_duration(value: timedelta) -> str:
    """``timedelta(hours=1, minutes=30)`` -> ``"1h30m"``; ``timedelta(seconds=45)`` -> ``"45s"``."""
    seconds = int(value.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts) or "0s"


def _utc(value: datetime) -> datetime:
    # Naive times in evidence are UTC by the telemetry contract.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _iso(value: datetime) -> str:
    return _utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe_signal(signal: CandidateHardware) -> str:
    """One line: ``xid 79 at 2026-11-29T18:45:02Z: GPU has fallen off the bus``."""
    code = f" {signal.code}" if signal.code is not None else ""
    when = f" at {_iso(signal.time)}" if signal.time else ""
    where = f" on {signal.gpu}" if signal.gpu else ""
    return f"{signal.kind}{code}{when}{where}: {signal.summary}"


def _host_of(candidate: Candidate, manifest: JobManifest | None) -> str | None:
    if candidate.host:
        return candidate.host
    return manifest.host_of(candidate.rank) if manifest else None


def _judge_candidate(
    candidate: Candidate, host: str, rule: EvidenceRule, as_of: datetime, *, derived: bool = False,
    rests_on_hardware: bool = False,
) -> tuple[tuple[str, ...] | None, BlockedNode | None]:
    """Evidence lines when the candidate's node may be isolated, else the block.

    A ``derived`` host (guessed from the scheduler's job record) needs a fresh supporting signal
    that names that very host (its node agent's), whatever the candidate's kind. So does a rank
    that ``rests_on_hardware``: only a fault on its own GPU set it apart from tied peers, so a
    policy that lets its kind go without a signal cannot let that signal be stale."""
    if derived:
        return _judge_derived(candidate, host, rule, as_of)
    rank = candidate.rank
    if candidate.kind in rule.never_isolate_for:
        return None, BlockedNode(
            gate=Gate.EVIDENCE, node=host,
            message=f"rank {rank} on {host} {_KIND_PHRASE[candidate.kind]}: "
                    "that is a program bug, not a node fault; no node is isolated for it",
        )
    on_host = [h for h in candidate.hardware if h.host in (None, host)]
    supporting = [h for h in on_host if h.bearing is HardwareBearing.SUPPORTS_HARDWARE_FAULT]
    oldest = as_of - rule.max_age
    newest = as_of + rule.clock_skew
    fresh = [h for h in supporting if h.time is not None and oldest <= _utc(h.time) <= newest]
    if fresh or (candidate.kind not in rule.hardware_signal_required_for and not rests_on_hardware):
        return tuple(describe_signal(h) for h in fresh), None
    if supporting:
        undated = [h for h in supporting if h.time is None]
        shown = supporting[0]
        if undated and len(undated) == len(supporting):
            why = f"{shown.kind} {shown.code} has no time, so its age cannot be judged"
        else:
            why = (f"{describe_signal(shown)} is outside the {human_duration(rule.max_age)} window "
                   f"before {_iso(as_of)}")
        return None, BlockedNode(
            gate=Gate.STALE_EVIDENCE, node=host,
            message=f"rank {rank} on {host}: {why}; stale evidence does not isolate a node",
        )
    app = [h for h in on_host if h.bearing is HardwareBearing.POINTS_AT_APPLICATION]
    oom = [h for h in on_host if h.bearing is HardwareBearing.EXPLAINS_MISSING_DUMP]
    if app:
        message = (f"rank {rank} on {host}: {app[0].kind} {app[0].code} points at the application, "
                   "not the node; no node is isolated")
    elif oom:
        message = (f"rank {rank} on {host}: the OOM killer ended its process, which explains the "
                   "missing dump but is not a node fault; no node is isolated")
    else:
        message = (f"rank {rank} {_KIND_PHRASE[candidate.kind]} and no hardware signal supports "
                   f"a fault on {host}")
    return None, BlockedNode(gate=Gate.EVIDENCE, node=host, message=message)


def _judge_derived(
    candidate: Candidate, host: str, rule: EvidenceRule, as_of: datetime
) -> tuple[tuple[str, ...] | None, BlockedNode | None]:
    oldest, newest = as_of - rule.max_age, as_of + rule.clock_skew
    fresh = [h for h in candidate.hardware if h.host == host and _node_fault(h)
             and h.time is not None and oldest <= _utc(h.time) <= newest]
    if candidate.kind in rule.never_isolate_for or not fresh:
        return None, BlockedNode(
            gate=Gate.EVIDENCE, node=host,
            message=f"rank {candidate.rank}: host {host} is derived from the scheduler's job record (a guess), "
                    f"and no fresh hardware signal from {host} itself supports a fault there; a derived host "
                    "alone never isolates a node")
    return (f"host {host} derived from the scheduler's job record, confirmed by its own signal",
            *(describe_signal(h) for h in fresh)), None


def _node_fault(signal: CandidateHardware) -> bool:
    """A signal that supports a fault, or an Xid whose code says the node needs isolating.

    A derived rank has no known GPU or pid, so correlation cannot tie an Xid on its host to it and
    calls it unrelated; for a derived host, that host's own agent reporting a node-level Xid in the
    incident window is exactly the confirmation asked for (the host is right, and it is faulty).
    """
    if signal.bearing is HardwareBearing.SUPPORTS_HARDWARE_FAULT:
        return True
    if signal.kind != "xid" or signal.code is None or signal.bearing is not HardwareBearing.UNRELATED:
        return False
    entry = default_xid_catalog().lookup(signal.code)
    return entry is not None and entry.supports_isolation_for(None)


def evidence_gate(
    result: TriageResult, manifest: JobManifest | None, rule: EvidenceRule, as_of: datetime
) -> EvidenceDecision:
    """Which nodes the evidence implicates, and why the others are not.

    Example: verdict ``incomplete``, rank 1 on gpu-node-002 ``stopped_reporting`` with an
    Xid 79 of bearing ``supports_hardware_fault`` ten minutes before ``as_of`` gives one proposal
    ``NodeProposal("gpu-node-002", (1,), ("xid 79 at ...: GPU has fallen off the bus",))``; the
    same rank with no hardware gives the block
    ``"rank 1 stopped reporting and no hardware signal supports a fault on gpu-node-002"``.
    """
    as_of = _utc(as_of)
    if result.verdict is Verdict.NO_HANG:
        return EvidenceDecision(blocked=[BlockedNode(
            gate=Gate.VERDICT,
            message="verdict is no_hang: no process group is stuck, so there is nothing to isolate",
        )])
    candidates, guesses = _by_group_verdict(result)
    rest_on_hardware = _resting_on_hardware(result)
    if result.verdict is Verdict.AMBIGUOUS and not candidates:
        named = ranks_phrase([c.rank for c in result.candidates]) if result.candidates else "no rank"
        return EvidenceDecision(blocked=[BlockedNode(
            gate=Gate.VERDICT,
            message=f"verdict is ambiguous: {named} could be behind the hang but the evidence "
                    "cannot say which; no node is isolated on a guess",
        )])
    if not result.candidates:
        return EvidenceDecision(blocked=[BlockedNode(
            gate=Gate.VERDICT,
            message=f"verdict is {result.verdict.value} but no candidate rank is named; "
                    "nothing to isolate",
        )])
    if result.as_of is not None and _utc(result.as_of) < as_of - rule.max_age:
        return EvidenceDecision(blocked=[BlockedNode(
            gate=Gate.STALE_EVIDENCE,
            message=f"the evidence is as of {_iso(result.as_of)}, more than "
                    f"{human_duration(rule.max_age)} before {_iso(as_of)}; stale evidence does not "
                    "isolate a node",
        )])

    by_node: dict[str, tuple[list[int], list[str]]] = {}
    blocked: list[BlockedNode] = list(guesses)
    for candidate in candidates:
        host = _host_of(candidate, manifest)
        if candidate.membership is Membership.INFERRED:
            # Without a manifest, a rank is only guessed to be in the group it is blamed for:
            # a hardware signal on its node does not make the guess a fact.
            blocked.append(BlockedNode(
                gate=Gate.EVIDENCE, node=host,
                message=f"rank {candidate.rank}: its membership of the stuck group is a guess (no "
                        "manifest names the group's members); no node is isolated on a guess"))
            continue
        if host is None:
            blocked.append(BlockedNode(
                gate=Gate.UNKNOWN_NODE,
                message=f"rank {candidate.rank}: no host is known (neither the candidate nor the "
                        "manifest names one), so no node can be chosen; add hosts to the manifest",
            ))
            continue
        identity = manifest.ranks.get(candidate.rank) if manifest is not None else None
        derived = identity is not None and identity.host == host and identity.host_is_derived
        evidence, block = _judge_candidate(candidate, host, rule, as_of, derived=derived,
                                           rests_on_hardware=candidate.rank in rest_on_hardware)
        if block is not None:
            blocked.append(block)
            continue
        ranks, lines = by_node.setdefault(host, ([], []))
        ranks.append(candidate.rank)
        lines.extend(line for line in evidence or () if line not in lines)
    # A node implicated by one rank is not "blocked" because a co-located rank lacks evidence.
    blocked = [b for b in blocked if b.node not in by_node]
    proposals = [
        NodeProposal(node=node, ranks=tuple(sorted(ranks)), evidence=tuple(lines))
        for node, (ranks, lines) in sorted(by_node.items())
    ]
    return EvidenceDecision(proposals=proposals, blocked=blocked)


def _resting_on_hardware(result: TriageResult) -> set[int]:
    """Ranks acted on only because a hardware fault broke a tie: no group the dumps alone make
    ``localized`` names them. An ``incomplete`` group proves nothing (its culprit may be the
    cause, or not), so naming the rank there too does not lift the need for a fresh signal."""
    separated = {r for g in result.groups if g.hardware_separated for r in g.candidates}
    proven = {r for g in result.groups if not g.hardware_separated and g.verdict is Verdict.LOCALIZED
              for r in g.candidates}
    return separated - proven


def _by_group_verdict(result: TriageResult) -> tuple[list[Candidate], list[BlockedNode]]:
    """The candidates that may be acted on, group by group, and a block per ambiguous group.

    One verdict per stuck group (``result.groups``): a rank named by a group whose own verdict
    is ``localized`` or ``incomplete`` may be acted on (the hardware gate still applies) while
    another group is ``ambiguous``; a rank named only by ambiguous groups is a guess. Without
    per-group verdicts (an older result) the incident's verdict decides for every candidate.
    """
    if not result.groups:
        ambiguous = result.verdict is Verdict.AMBIGUOUS
        return ([] if ambiguous else list(result.candidates)), []
    actionable = {r for g in result.groups if g.verdict in (Verdict.LOCALIZED, Verdict.INCOMPLETE)
                  for r in g.candidates}
    grouped = {r for g in result.groups for r in g.candidates}
    kept = [c for c in result.candidates if c.rank in actionable or c.rank not in grouped]
    blocked = []
    for group in result.groups:
        if group.verdict is not Verdict.AMBIGUOUS or actionable.issuperset(group.candidates):
            continue
        at = (f"collective #{group.collective_seq_id}" if group.collective_seq_id is not None
              else f"p2p_seq_id {group.p2p_seq_id}")
        named = ranks_phrase([r for r in group.candidates if r not in actionable])
        blocked.append(BlockedNode(
            gate=Gate.VERDICT,
            message=f"process group {group.process_group!r} {at} is ambiguous: {named} could be "
                    "behind it but the evidence cannot say which; no node is isolated on a guess"))
    # One line per set of ranks: many stuck groups usually wait on the same ambiguous pair.
    unique: dict[str, BlockedNode] = {}
    for block in blocked:
        unique.setdefault(block.message.split(" is ambiguous: ", 1)[1], block)
    return kept, list(unique.values())


def node_gate(
    node: str,
    facts: ClusterFacts | None,
    limits: SafetyLimits,
    reason_prefix: str,
    incident_id: str,
) -> BlockedNode | None:
    """Refuse a node that is opted out, unknown, or already isolated by someone else.

    Without facts (planning offline) only the policy's opt-out list can be checked; the executor
    runs this gate again on live facts before acting.
    """
    if node in limits.opt_out_nodes:
        return BlockedNode(gate=Gate.OPT_OUT, node=node,
                           message=f"{node} is on the policy's opt-out list; it is never touched")
    if facts is None:
        return None
    current = facts.node(node)
    if not current.exists:
        return BlockedNode(
            gate=Gate.UNKNOWN_NODE, node=node,
            message=f"{node} is not known to the scheduler; check the host names in the manifest",
        )
    if current.opted_out:
        return BlockedNode(gate=Gate.OPT_OUT, node=node,
                           message=f"{node} carries the opt-out marker; it is never touched")
    if current.overridden_by:
        return BlockedNode(
            gate=Gate.OPT_OUT, node=node,
            message=f"a person undid Denpex's earlier isolation of {node} ({current.overridden_by}); "
                    "a manual uncordon cancels the automated workflow, so it is not isolated again",
        )
    owner = current.owner(reason_prefix, incident_id)
    if owner in (ReasonOwner.SOMEONE_ELSE, ReasonOwner.OTHER_INCIDENT):
        whose = "another Denpex incident" if owner is ReasonOwner.OTHER_INCIDENT else "someone else"
        return BlockedNode(
            gate=Gate.FOREIGN_REASON, node=node,
            message=f"{node} is already isolated by {whose} (state {current.state}, reason "
                    f"{current.reason or '(none)'!r}); Denpex never overwrites or undoes it",
        )
    return None


def blast_radius_gate(
    new_nodes: Iterable[str],
    facts: ClusterFacts | None,
    limits: SafetyLimits,
    breaker: BreakerState,
    *,
    incident_nodes: Iterable[str] = (),
    recent_on_cluster: Sequence[str] = (),
) -> RadiusDecision:
    """Block everything when the breaker is open or these isolations would exceed a limit.

    Shares count nodes isolated by anyone: with 16 nodes in partition ``gpu``, one already
    drained by a person and a limit of 10%, isolating one more gives 2/16 = 12.5% and trips.
    The per-incident count adds ``incident_nodes``, those this incident already isolates, so a
    re-triaged plan of the same incident cannot take it past the limit one node at a time.
    ``recent_on_cluster`` lists the isolations Denpex applied on this cluster in the last hour,
    by any incident: with a limit of 4 and 3 recent ones, isolating 2 more trips the breaker.
    """
    new = sorted(set(new_nodes))
    if not new:
        return RadiusDecision()
    if breaker.tripped:
        since = _iso(breaker.tripped_at) if breaker.tripped_at else "an unknown time"
        return RadiusDecision(blocked=[BlockedNode(
            gate=Gate.CIRCUIT_BREAKER,
            message=f"the circuit breaker is tripped (since {since}, incident "
                    f"{breaker.tripped_by_incident}: {breaker.trip_reason}); nothing is isolated "
                    "until a person resets it with `denpex breaker reset --by NAME`",
        )])
    trips: list[str] = []
    earlier = set(incident_nodes) - set(new)
    incident = sorted(earlier | set(new))
    if len(incident) > limits.max_nodes_per_incident:
        already = f" ({len(earlier)} already isolated by this incident)" if earlier else ""
        trips.append(f"{len(incident)} nodes ({', '.join(incident)}) is over the limit of "
                     f"{limits.max_nodes_per_incident} per incident{already}")
    hourly = limits.max_isolations_per_cluster_per_hour
    if len(recent_on_cluster) + len(new) > hourly:
        trips.append(f"{len(recent_on_cluster)} isolation(s) on this cluster in the last hour plus "
                     f"{len(new)} now is over the limit of {hourly} per hour across incidents "
                     "(a storm of incidents points at a shared fault, not at many broken nodes)")
    if facts is not None and facts.nodes:
        trips.extend(_share_trips(new, facts, limits.max_isolated_fraction))
    if not trips:
        return RadiusDecision()
    reason = "; ".join(trips)
    return RadiusDecision(
        blocked=[BlockedNode(
            gate=Gate.CIRCUIT_BREAKER,
            message=f"circuit breaker: {reason}; no node is isolated, and automated isolation "
                    "stays off until a person resets the breaker",
        )],
        trip_reason=reason,
    )


def _share_trips(new: Sequence[str], facts: ClusterFacts, limit: float) -> list[str]:
    already = facts.isolated_nodes()
    groups = {f"partition {name}": members for name, members in facts.partitions().items()}
    groups["the cluster"] = tuple(sorted(facts.nodes))
    trips = []
    for label, members in groups.items():
        member_set = set(members)
        if not member_set.intersection(new):
            continue
        after = (already | set(new)) & member_set
        share = len(after) / len(member_set)
        if share > limit:
            trips.append(
                f"{label} would have {len(after)} of {len(member_set)} nodes isolated "
                f"({share:.0%}, {len(already & member_set)} already isolated by anyone), over the "
                f"{limit:.0%} limit"
            )
    return trips
