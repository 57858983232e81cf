"""The checks made before a run touches a node, against the operator's configuration, never the
plan's own word: the plan's policy and evidence (``check_plan_policy``), the cluster the settings
reach (``reached_cluster``, ``check_plan_cluster``) and whose approvers apply there (``tenancy``).
"""

from __future__ import annotations

from denpex.analysis.models import Verdict
from denpex.isolation.adapter import ClusterAdapter
from denpex.isolation.errors import ApprovalError, PolicyMismatchError, RemoteError
from denpex.isolation.facts import owned_reason_prefix
from denpex.isolation.operator import OperatorConfig
from denpex.isolation.plan import IsolationPlan, Operation
from denpex.isolation.policy import IsolationPolicy
from denpex.tenancy import ClusterOwnership, OwnershipState, TenancyDecision, execution_tenant, read_ownership

__all__ = ["VERDICTS_WITH_CULPRIT", "check_plan_cluster", "check_plan_policy", "reached_cluster", "tenancy"]

VERDICTS_WITH_CULPRIT = frozenset({Verdict.LOCALIZED.value, Verdict.INCOMPLETE.value})
"""Verdicts that can name a culprit; ``no_hang`` and ``ambiguous`` never isolate a node."""


def check_plan_cluster(plan: IsolationPlan, cluster: str | None) -> None:
    """Refuse a plan made for another cluster than the one the settings reach."""
    if plan.cluster is not None and cluster != plan.cluster:
        raise ApprovalError(f"execution refused: the plan was made for cluster {plan.cluster!r}, but the "
                            f"settings reach {cluster or 'a cluster that does not say its name'!r}; "
                            "nothing was done")


def tenancy(plan: IsolationPlan, operator: OperatorConfig, cluster: str | None) -> TenancyDecision:
    """Whose approvers apply: the registry's owner of the reached cluster, never the plan's word.

    A plan naming another tenant is refused here, before anything is read from the cluster's nodes.
    """
    # A cluster that does not say its name has no owner to look up; the approval check refuses it.
    ownership = (read_ownership(operator.state_dir, cluster) if cluster
                 else ClusterOwnership("(unnamed)", OwnershipState.UNREGISTERED))
    decision = execution_tenant(ownership, plan.tenant)
    if not decision.allowed:
        raise ApprovalError(f"execution refused: {decision.reason}; nothing was done")
    return decision


def reached_cluster(adapter: ClusterAdapter, operator: OperatorConfig) -> str | None:
    """The name of the cluster the settings reach: the adapter's word, else the operator's setting."""
    try:
        said = adapter.cluster_name()
    except RemoteError as exc:
        raise type(exc)(f"{exc}. The run stopped while reading the cluster's name, before changing any "
                        "node") from exc
    if said and operator.cluster and said != operator.cluster:
        raise ApprovalError(f"execution refused: the settings name cluster {operator.cluster!r} but it "
                            f"calls itself {said!r}; nothing was done")
    return said or operator.cluster


def check_plan_policy(plan: IsolationPlan, policy: IsolationPolicy, operation: Operation) -> None:
    """Raise PolicyMismatchError listing every way ``plan`` departs from the operator's ``policy``
    or does not support its actions.

    A rollback only undoes what this incident owns, so only the reason prefix must agree: undoing
    an isolation stays possible after the runbook changed.
    """
    problems: list[str] = []
    if operation is Operation.ROLLBACK:
        if plan.policy.reason_prefix != policy.reason_prefix:
            problems.append(f"the plan's reason prefix {plan.policy.reason_prefix!r} is not the operator's "
                            f"{policy.reason_prefix!r}")
        # The undo acts on the reason's incident tag (Kubernetes taint value and annotations).
        problems += _reason_problems(plan, policy)
    else:
        problems += _isolate_problems(plan, policy)
    if problems:
        raise PolicyMismatchError("execution refused: " + "; ".join(problems) + "; nothing was done")


def _isolate_problems(plan: IsolationPlan, policy: IsolationPolicy) -> list[str]:
    problems = []
    if plan.policy != policy:
        differs = sorted(k for k in type(policy).model_fields if getattr(plan.policy, k) != getattr(policy, k))
        problems.append(f"the plan's policy differs from the operator's runbook ({', '.join(differs)}); "
                        "policy comes from the operator's configuration, never from the plan: triage "
                        "again with the operator's runbook")
    if plan.actions and plan.verdict not in VERDICTS_WITH_CULPRIT:
        problems.append(f"the plan's verdict {plan.verdict!r} names no culprit, yet it has actions")
    steps = policy.remediation.for_scheduler(plan.scheduler)
    for action in plan.actions:
        if not action.evidence and policy.evidence.hardware_signal_required_for:
            problems.append(f"{action.node} has no supporting evidence")
        if (action.action, action.rollback) != (steps.act, steps.rollback) \
                or action.pre_checks != steps.check or action.post_checks != steps.verify:
            problems.append(f"{action.node}'s steps are not the runbook's ({steps.act.value}, "
                            f"rollback {steps.rollback.value})")
    return problems + _reason_problems(plan, policy)


def _reason_problems(plan: IsolationPlan, policy: IsolationPolicy) -> list[str]:
    owned = owned_reason_prefix(policy.reason_prefix, plan.incident_id)
    return [f"{action.node}'s reason does not start with {owned!r}" for action in plan.actions
            if not (action.reason == owned or action.reason.startswith(owned + " "))]
