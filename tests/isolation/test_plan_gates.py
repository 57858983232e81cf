"""plan_isolation and its safety gates, decided on in-memory facts (no cluster needed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from denpex.analysis.models import CandidateKind, GroupVerdict, HardwareBearing, Membership, TriageResult, Verdict
from denpex.evidence.manifest import JobManifest
from denpex.isolation.breaker import BreakerState
from denpex.isolation.plan import Gate, IsolationPlan, NodeAction, load_plan, save_plan
from denpex.isolation.planner import plan_isolation
from denpex.isolation.policy import (
    ActionKind,
    EvidenceRule,
    IsolationPolicy,
    RollbackKind,
    SafetyLimits,
    Scheduler,
)
from isolation.triage_cases import NOW, candidate, cluster, killed_process, result_with, signal

POLICY = IsolationPolicy()


def plan(result, facts=None, *, policy=POLICY, scheduler=Scheduler.SLURM, breaker=None,
         manifest=None, as_of=NOW) -> IsolationPlan:
    return plan_isolation(result, manifest, policy, facts, scheduler, "inc-42", as_of, breaker=breaker)


def test_killed_process_without_telemetry_recommends_no_drain_and_says_why() -> None:
    p = plan(killed_process(), cluster())
    assert p.contract_view() == {
        "recommend_isolation": False,
        "actions": [],
        "blocked": ["rank 1 stopped reporting and no hardware signal supports a fault on gpu-node-002"],
    }
    assert [b.gate for b in p.blocked] == [Gate.EVIDENCE]


def test_killed_process_with_xid79_drains_exactly_that_node() -> None:
    p = plan(killed_process(hardware=[signal(79)]), cluster())
    assert p.contract_view() == {"recommend_isolation": True,
                                 "actions": [{"node": "gpu-node-002", "action": "drain"}], "blocked": []}
    [action] = p.actions
    assert action.reason.startswith("denpex:inc-42 rank 1: xid 79 at 2026-11-29T18:45:00Z")
    assert action.rollback is RollbackKind.RESUME
    assert "GPU has fallen off the bus" in action.evidence[0]


def test_kubernetes_plan_cordons_and_taints() -> None:
    p = plan(killed_process(hardware=[signal(79)]), scheduler=Scheduler.KUBERNETES)
    assert [(a.node, a.action, a.rollback) for a in p.actions] == [
        ("gpu-node-002", ActionKind.CORDON_TAINT, RollbackKind.UNCORDON)]


@pytest.mark.parametrize(
    ("result", "gate", "needle"),
    [
        pytest.param(result_with(Verdict.NO_HANG, []), Gate.VERDICT, "no_hang", id="no-hang"),
        pytest.param(result_with(Verdict.AMBIGUOUS, [candidate(1, hardware=[signal()]), candidate(3)]),
                     Gate.VERDICT, "ranks 1, 3 could be behind", id="ambiguous-even-with-xid"),
        pytest.param(result_with(Verdict.INCOMPLETE, []), Gate.VERDICT, "no candidate", id="incomplete-no-candidate"),
        pytest.param(killed_process(hardware=[signal(age=timedelta(hours=3))]), Gate.STALE_EVIDENCE,
                     "outside the 1h window", id="stale-signal"),
        pytest.param(killed_process(hardware=[signal(dated=False)]), Gate.STALE_EVIDENCE,
                     "has no time", id="undated-signal"),
        pytest.param(killed_process(hardware=[signal(as_of=NOW - timedelta(days=30))], as_of=NOW - timedelta(days=30)),
                     Gate.STALE_EVIDENCE, "the evidence is as of 2026-10-30", id="stale-triage"),
        pytest.param(killed_process(hardware=[signal(13, bearing=HardwareBearing.POINTS_AT_APPLICATION,
                                                     summary="Graphics Engine Exception")]),
                     Gate.EVIDENCE, "xid 13 points at the application", id="xid13-application"),
        pytest.param(killed_process(hardware=[signal(None, kind="oom", bearing=HardwareBearing.EXPLAINS_MISSING_DUMP,
                                                     summary="Killed process 4242 (python)")]),
                     Gate.EVIDENCE, "OOM killer", id="oom"),
        pytest.param(killed_process(hardware=[signal(79, host="gpu-node-009")]), Gate.EVIDENCE,
                     "no hardware signal supports a fault on gpu-node-002", id="xid-on-other-host"),
        pytest.param(result_with(Verdict.LOCALIZED, [candidate(2, kind=CandidateKind.MISMATCH, hardware=[signal()])]),
                     Gate.EVIDENCE, "program bug", id="mismatch-never"),
        pytest.param(killed_process(hardware=[signal()], host=None), Gate.UNKNOWN_NODE, "no host is known",
                     id="no-host"),
        pytest.param(result_with(Verdict.INCOMPLETE, [candidate(1, hardware=[signal()]).model_copy(
                         update={"membership": Membership.INFERRED})]),
                     Gate.EVIDENCE, "membership of the stuck group is a guess", id="inferred-member-with-xid"),
    ],
)
def test_evidence_gates_block_with_a_reason(result, gate: Gate, needle: str) -> None:
    p = plan(result, cluster())
    assert not p.recommend_isolation and p.actions == ()
    assert [b.gate for b in p.blocked] == [gate]
    assert needle in p.blocked[0].message


def test_host_comes_from_the_manifest_when_the_candidate_has_none() -> None:
    manifest = JobManifest(world_size=4, job_id="job-9", ranks={1: {"host": "gpu-node-002"}})
    p = plan(killed_process(hardware=[signal()], host=None), cluster(), manifest=manifest)
    assert [a.node for a in p.actions] == ["gpu-node-002"] and p.job_id == "job-9"


def test_stalled_rank_with_signal_is_isolated_but_policy_can_require_nothing_else() -> None:
    stalled = result_with(Verdict.LOCALIZED, [candidate(5, host="gpu-node-006", kind=CandidateKind.STALLED)])
    assert not plan(stalled, cluster()).recommend_isolation
    lenient = IsolationPolicy(evidence=EvidenceRule(hardware_signal_required_for=frozenset()))
    p = plan(stalled, cluster(), policy=lenient)
    assert [a.node for a in p.actions] == ["gpu-node-006"]
    assert "without a hardware signal" in p.actions[0].reason


def _separated_pair(*, age: timedelta, also_proven: bool = False, also_incomplete: bool = False) -> TriageResult:
    """Ranks 4, 5 tied in tp collective 16; an Xid on rank 5's own GPU ``age`` ago set rank 5 apart."""
    five = candidate(5, host="gpu-node-006", kind=CandidateKind.STALLED, hardware=[signal(host="gpu-node-006", age=age)])
    groups = [GroupVerdict(process_group="0", collective_seq_id=16, verdict=Verdict.LOCALIZED, candidates=[5],
                           hardware_separated=True)]
    if also_proven:  # the dumps prove rank 5 in another group as well
        groups.append(GroupVerdict(process_group="ep", collective_seq_id=3, verdict=Verdict.LOCALIZED, candidates=[5]))
    if also_incomplete:  # a dp op whose waits reach rank 5 and a silent rank: may be the cause, or not
        groups.append(GroupVerdict(process_group="dp", collective_seq_id=7, verdict=Verdict.INCOMPLETE,
                                   candidates=[5, 9]))
    return result_with(Verdict.LOCALIZED, [five]).model_copy(update={"groups": groups})


def test_a_rank_set_apart_only_by_hardware_needs_a_fresh_signal_whatever_the_policy() -> None:
    """Hostile review of the tie rule: a policy that lets ``stalled`` go without a signal must not
    let a tie broken by a stale Xid drain a node: the rank is named only because of that Xid."""
    lenient = IsolationPolicy(evidence=EvidenceRule(hardware_signal_required_for=frozenset()))
    stale = plan(_separated_pair(age=timedelta(hours=3)), cluster(), policy=lenient)
    assert not stale.actions
    assert [(b.gate, b.node) for b in stale.blocked] == [(Gate.STALE_EVIDENCE, "gpu-node-006")]
    fresh = plan(_separated_pair(age=timedelta(minutes=5)), cluster(), policy=lenient)
    assert [(a.node, a.ranks) for a in fresh.actions] == [("gpu-node-006", (5,))]
    # Hostile review: an incomplete group naming it too proves nothing, so the signal must still be fresh.
    beside = plan(_separated_pair(age=timedelta(hours=3), also_incomplete=True), cluster(), policy=lenient)
    assert "gpu-node-006" not in [a.node for a in beside.actions]
    assert (Gate.STALE_EVIDENCE, "gpu-node-006") in [(b.gate, b.node) for b in beside.blocked]
    # Proven by the dumps in a group of its own, the rank falls under the policy as any other.
    proven = plan(_separated_pair(age=timedelta(hours=3), also_proven=True), cluster(), policy=lenient)
    assert [a.node for a in proven.actions] == ["gpu-node-006"]


def test_hardware_separated_appears_in_the_json_only_where_true() -> None:
    dumped = [g.model_dump(mode="json") for g in _separated_pair(age=timedelta(0), also_proven=True).groups]
    assert [g.get("hardware_separated") for g in dumped] == [True, None]


def test_two_ranks_on_one_node_make_one_action() -> None:
    result = result_with(Verdict.LOCALIZED, [
        candidate(4, host="gpu-node-003", kind=CandidateKind.STALLED, hardware=[signal(host="gpu-node-003")]),
        candidate(5, host="gpu-node-003", kind=CandidateKind.STALLED),
    ])
    p = plan(result, cluster())
    assert [(a.node, a.ranks) for a in p.actions] == [("gpu-node-003", (4,))]
    assert p.blocked == ()  # rank 5's missing signal does not "block" a node already isolated for rank 4


@pytest.mark.parametrize(
    ("facts", "policy", "gate", "needle"),
    [
        pytest.param(cluster(), IsolationPolicy(limits=SafetyLimits(opt_out_nodes=frozenset({"gpu-node-002"}))),
                     Gate.OPT_OUT, "opt-out list", id="opt-out-list"),
        pytest.param(None, IsolationPolicy(limits=SafetyLimits(opt_out_nodes=frozenset({"gpu-node-002"}))),
                     Gate.OPT_OUT, "opt-out list", id="opt-out-list-offline"),
        pytest.param(cluster(opted_out=["gpu-node-002"]), POLICY, Gate.OPT_OUT, "opt-out marker", id="opt-out-feature"),
        pytest.param(cluster(drained={"gpu-node-002": "bad DIMM, ticket 881"}), POLICY, Gate.FOREIGN_REASON,
                     "already isolated by someone else", id="foreign-reason"),
        pytest.param(cluster(drained={"gpu-node-002": ""}), POLICY, Gate.FOREIGN_REASON,
                     "someone else", id="drained-without-reason"),
        pytest.param(cluster(drained={"gpu-node-002": "denpex:inc-7 rank 3: xid 48"}), POLICY, Gate.FOREIGN_REASON,
                     "another Denpex incident", id="other-incident"),
        pytest.param(cluster(drained={"gpu-node-002": "denpex:inc-4 rank 1"}), POLICY, Gate.FOREIGN_REASON,
                     "another Denpex incident", id="prefix-of-our-id-is-not-ours"),
        pytest.param(cluster(count=1), POLICY, Gate.UNKNOWN_NODE, "not known to the scheduler", id="unknown-node"),
    ],
)
def test_node_gates_block_with_a_reason(facts, policy, gate: Gate, needle: str) -> None:
    p = plan(killed_process(hardware=[signal()]), facts, policy=policy)
    assert p.actions == ()
    assert [b.gate for b in p.blocked] == [gate]
    assert needle in p.blocked[0].message


def test_a_drain_this_incident_already_owns_stays_in_the_plan() -> None:
    facts = cluster(drained={"gpu-node-002": "denpex:inc-42 rank 1: xid 79"})
    p = plan(killed_process(hardware=[signal()]), facts)
    assert [a.node for a in p.actions] == ["gpu-node-002"] and p.blocked == ()


def _many(count: int):
    return result_with(Verdict.LOCALIZED, [
        candidate(r, host=f"gpu-node-{r:03d}", kind=CandidateKind.STALLED, hardware=[signal(host=f"gpu-node-{r:03d}")])
        for r in range(1, count + 1)
    ])


def test_breaker_blocks_an_incident_over_the_node_limit_and_asks_to_trip() -> None:
    p = plan(_many(3), cluster(count=64))
    assert p.actions == ()
    assert [b.gate for b in p.blocked] == [Gate.CIRCUIT_BREAKER]
    assert "3 nodes (gpu-node-001, gpu-node-002, gpu-node-003) is over the limit of 2 per incident" in p.breaker_trip


def test_breaker_counts_nodes_drained_by_anyone_in_the_partition_share() -> None:
    # 16 nodes, a person drained one, the limit is 10%: one more makes 2/16 = 12.5%.
    facts = cluster(drained={"gpu-node-010": "cable swap"})
    p = plan(killed_process(hardware=[signal()]), facts)
    assert p.actions == ()
    assert "partition gpu would have 2 of 16 nodes isolated (12%, 1 already isolated by anyone)" in p.breaker_trip
    # Without the person's drain, 1/16 = 6% is fine.
    assert plan(killed_process(hardware=[signal()]), cluster()).recommend_isolation


def test_tripped_breaker_blocks_everything_until_reset() -> None:
    tripped = BreakerState(tripped=True, tripped_at=NOW - timedelta(hours=1), tripped_by_incident="inc-1",
                           trip_reason="5 nodes is over the limit")
    p = plan(killed_process(hardware=[signal()]), cluster(), breaker=tripped)
    assert p.actions == () and p.breaker_trip is None
    assert "circuit breaker is tripped" in p.blocked[0].message
    assert "denpex breaker reset" in p.blocked[0].message
    reset = tripped.model_copy(update={"tripped": False, "reset_by": "alice"})
    assert plan(killed_process(hardware=[signal()]), cluster(), breaker=reset).recommend_isolation


def test_plan_hash_is_stable_and_covers_the_content(tmp_path) -> None:
    a = plan(killed_process(hardware=[signal()]), cluster())
    b = plan(killed_process(hardware=[signal()]), cluster())
    assert a.content_hash() == b.content_hash()
    assert plan(killed_process(hardware=[signal(48)]), cluster()).content_hash() != a.content_hash()
    stricter = IsolationPolicy(limits=SafetyLimits(max_nodes_per_incident=1))
    assert plan(killed_process(hardware=[signal()]), cluster(), policy=stricter).content_hash() != a.content_hash()
    save_plan(a, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json").content_hash() == a.content_hash()
    # The same instant in another zone is the same plan.
    c = plan(killed_process(hardware=[signal()]), cluster(),
             as_of=NOW.astimezone(datetime.now().astimezone().tzinfo or UTC))
    assert c.content_hash() == a.content_hash()


def test_edited_plan_file_is_refused_with_a_clear_error(tmp_path) -> None:
    path = tmp_path / "plan.json"
    save_plan(plan(killed_process(hardware=[signal()]), cluster()), path)
    body = json.loads(path.read_text())
    body["actions"][0]["node"] = "gpu-node-[001-016]"
    path.write_text(json.dumps(body))
    with pytest.raises(Exception, match="actions.0.node"):
        load_plan(path)


@pytest.mark.parametrize("node", ["gpu-node-[001-016]", "a,b", "node 1", "", "-x"], ids=str)
def test_node_action_refuses_anything_but_one_plain_node_name(node: str) -> None:
    with pytest.raises(ValidationError):
        NodeAction(node=node, action=ActionKind.DRAIN, reason="denpex:inc-1 x", pre_checks=(),
                   post_checks=(), rollback=RollbackKind.RESUME)


def test_reason_is_one_bounded_line() -> None:
    long = signal(summary="x" * 400 + "\nsecond line")
    [action] = plan(killed_process(hardware=[long]), cluster()).actions
    assert len(action.reason) <= 250 and "\n" not in action.reason
    assert action.reason.startswith("denpex:inc-42 rank 1: ")


def test_plan_hash_is_the_same_in_another_process(tmp_path) -> None:
    # Sets inside the policy must not leak their (per-process, randomized) iteration order.
    import os
    import subprocess
    import sys

    policy = IsolationPolicy(limits=SafetyLimits(opt_out_nodes=frozenset({"n1", "n2", "n3", "n4", "n5"})))
    p = plan(killed_process(hardware=[signal()]), cluster(), policy=policy)
    save_plan(p, tmp_path / "plan.json")
    code = ("import sys; from pathlib import Path; from denpex.isolation.plan import load_plan; "
            "print(load_plan(Path(sys.argv[1])).content_hash())")
    hashes = {
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "plan.json")], capture_output=True, text=True,
                       check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert hashes == {p.content_hash()}


def test_per_incident_limit_counts_the_nodes_this_incident_already_isolates() -> None:
    facts = cluster(drained={"gpu-node-002": "denpex:inc-42 rank 1: xid 79"})
    one = IsolationPolicy(limits=SafetyLimits(max_nodes_per_incident=1, max_isolated_fraction=0.5))
    later = plan(killed_process(hardware=[signal(host="gpu-node-003")], host="gpu-node-003"), facts, policy=one)
    assert later.actions == () and [b.gate for b in later.blocked] == [Gate.CIRCUIT_BREAKER]
    assert ("2 nodes (gpu-node-002, gpu-node-003) is over the limit of 1 per incident "
            "(1 already isolated by this incident)") in (later.breaker_trip or "")
    # Re-planning the node it already isolates stays within the limit.
    assert plan(killed_process(hardware=[signal()]), facts, policy=one).recommend_isolation
