"""What the incident flow tells about itself: the run's name and its log lines, as plain text.

Flow parameters are untrusted (anyone who reaches the Prefect API can start a run), and the run's
name is set before the flow checks them, so the name is made of bounded, sanitized parts::

    incident_run_name("lab", "inc-42")              -> "lab/inc-42"
    incident_run_name("lab\\n", "x" * 500)           -> "lab_/xxx...x" (63 x's)
    incident_run_name(None, "../../etc")            -> "?/.._.._etc"

The log lines name the coverage, the verdict, the plan, who approved and what ran, one line each.
"""

from __future__ import annotations

import re

from denpex.analysis.models import TriageResult
from denpex.analysis.wording import ranks_phrase
from denpex.isolation.run.report import ExecutionReport
from denpex.isolation.plan import IsolationPlan
from denpex.markdown_text import visible
from denpex.report import PlanView

__all__ = ["MAX_NAME_PART", "incident_run_name", "plain", "verdict_line", "plan_line", "execution_line",
           "state_message"]

MAX_NAME_PART = 63
"""As a Kubernetes label value: a cluster or incident id never needs more."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
MAX_MESSAGE = 300


def incident_run_name(cluster: object, incident_id: object) -> str:
    """``<cluster>/<incident>``, each part cut to 63 characters of ``A-Za-z0-9._-`` (runs of any other
    character become one ``_``; a part that is missing or empty becomes ``?``)."""
    return f"{_name_part(cluster)}/{_name_part(incident_id)}"


def _name_part(value: object) -> str:
    text = _UNSAFE.sub("_", value if isinstance(value, str) else "")[:MAX_NAME_PART]
    return text or "?"


def plain(text: object, limit: int = 200) -> str:
    """``text`` on one line (control characters become a space), at most ``limit`` characters,
    invisible ones (a bidi override) written out by their codes (``visible``)."""
    flat = _CONTROL.sub(" ", str(text)).strip()
    return visible(flat if len(flat) <= limit else flat[: limit - 3] + "...")


def verdict_line(result: TriageResult) -> str:
    """``localized: rank 2 (not_entered) on gpu-node-003; 4 of 4 ranks reported``."""
    who = ", ".join(f"rank {c.rank} ({c.kind.value}){f' on {c.host}' if c.host else ''}"
                    for c in result.candidates[:4])
    more = f" and {len(result.candidates) - 4} more" if len(result.candidates) > 4 else ""
    missing = f", none usable from {ranks_phrase(result.missing_ranks, limit=8)}" if result.missing_ranks else ""
    return plain(f"{result.verdict.value}: {who or 'no candidate'}{more}; {len(result.ranks_with_evidence)} of "
                 f"{result.world_size} ranks reported{missing}", 400)


def plan_line(view: PlanView, plan: IsolationPlan | None) -> str:
    """``drain gpu-node-003 (plan 1a2b3c4d5e6f)``, or why nothing is proposed."""
    if plan is not None and plan.actions:
        actions = ", ".join(f"{a.action.value} {a.node}" for a in plan.actions[:8])
        return plain(f"{actions} (plan {plan.content_hash()[:12]}), waiting for approval", 400)
    return plain("no isolation proposed: " + ("; ".join(view.blocked) or "nothing to isolate"), 400)


def execution_line(execution: ExecutionReport) -> str:
    """``gpu-node-003: act, applied, now IDLE+DRAIN``, one part per node."""
    parts = [f"{n.node}: {n.decision.value}, {n.outcome.value if n.outcome else 'dry run'}"
             f"{f', now {n.state_after}' if n.state_after else ''}" for n in execution.nodes[:8]]
    return plain("; ".join(parts) or "no node", 400)


def state_message(result: TriageResult, outcome: str, reason: str) -> str:
    """The run's final state message: the verdict first, then what became of it."""
    return plain(f"{verdict_line(result)}. {outcome}: {reason}", MAX_MESSAGE)
