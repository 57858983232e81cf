"""Declarative, operator-reviewed runbooks (``runbooks/*.yaml``).

A runbook names itself and its owner, and carries the policy: which evidence is required, the
safety limits, who approves and for how long, and the check/act/verify/rollback steps per
scheduler. Unknown keys are refused, so a typo such as ``max_node_per_incident`` fails loudly
instead of silently keeping the default. The flow executes a runbook; it does not hard-code one.
"""

from __future__ import annotations

from collections.abc import Set
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from denpex.evidence.loading import FileKind, read_model
from denpex.isolation.errors import RunbookError
from denpex.isolation.policy import (
    ApprovalRule,
    EvidenceRule,
    IsolationPolicy,
    RemediationSteps,
    SafetyLimits,
    SecondFactor,
)
from denpex.isolation.workflow_section import WorkflowSection

__all__ = ["Runbook", "load_runbook", "form_runbook_refusal"]

_MAX_BYTES = 256 * 1024
_RUNBOOK_FILE = FileKind("runbook", invalid="invalid runbook", unparsable="runbook is not valid YAML",
                         shape="a runbook is a YAML mapping, got {type}")


class Runbook(BaseModel):
    """One runbook file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{1,62}$")
    version: int = Field(ge=1)
    owner: str = Field(min_length=1)
    description: str = ""
    reason_prefix: str = "denpex"
    evidence: EvidenceRule = EvidenceRule()
    limits: SafetyLimits = SafetyLimits()
    approval: ApprovalRule = ApprovalRule()
    remediation: RemediationSteps = RemediationSteps()
    workflow: WorkflowSection = WorkflowSection()
    """How the incident flow waits (evidence grace, approval timeout); not part of the plan's policy."""

    def policy(self) -> IsolationPolicy:
        """The policy a plan carries (and the executor enforces)."""
        return IsolationPolicy(
            reason_prefix=self.reason_prefix, evidence=self.evidence, limits=self.limits,
            approval=self.approval, remediation=self.remediation,
        )


def load_runbook(path: Path) -> Runbook:
    """Read and validate a runbook; every problem is listed in one RunbookError."""
    return read_model(path, Runbook, max_bytes=_MAX_BYTES, kind=_RUNBOOK_FILE, error=RunbookError, syntax="yaml")


def form_runbook_refusal(name: str, runbook: Runbook, allowed: Set[str]) -> str | None:
    """Why a run may not follow runbook ``name`` (None: it may).

    ``approval.second_factor: none`` hands the decision to Prefect's form, that is to whoever can
    write to the Prefect API, and the block that picks the runbook is one they can edit. So a
    runbook that drops the second factor is followed only where the operator's own configuration
    names it (``allowed``: the worker's ``DENPEX_PREFECT_FORM_RUNBOOKS``), never because the block
    points at it."""
    if runbook.approval.second_factor is not SecondFactor.NONE or name in allowed:
        return None
    listed = ", ".join(entry[:64] for entry in sorted(allowed)[:8]) or "none"
    return (f"runbook {name!r} keeps Prefect's form (approval.second_factor: none), and the operator has not "
            f"allowed it on this worker (it allows: {listed}): a runbook without a second factor is followed "
            f"only when DENPEX_PREFECT_FORM_RUNBOOKS on the flow's workers names it (its file name without "
            f".yaml), because the "
            f"denpex-runbook/default block that chose it can be edited by anyone who writes to the Prefect API; "
            f"nothing was done")
