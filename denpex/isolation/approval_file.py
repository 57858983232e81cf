"""A plan's approval as a file beside it, for ``denpex approve`` and ``denpex isolate --execute``.

    default_approval_path(Path("plans/plan.json"))  -> plans/plan.approval.json
    load_signed_approval(path)                       -> the Approval, if it is ``cli-signed``
"""

from __future__ import annotations

from pathlib import Path

from denpex.isolation.approval import Approval, load_approval
from denpex.isolation.errors import ApprovalError
from denpex.isolation.policy import ApprovalChannel

__all__ = ["default_approval_path", "load_signed_approval"]


def default_approval_path(plan_path: Path) -> Path:
    """Where ``approve`` writes, and ``isolate`` reads, the approval of the plan at ``plan_path``."""
    return plan_path.with_name(plan_path.name.removesuffix(".json") + ".approval.json")


def load_signed_approval(path: Path) -> Approval:
    """The approval at ``path``, which must be ``cli-signed``.

    A ``prefect-ui`` record proves nothing in a file: its proof is the flow run a person resumed,
    and only that flow builds it. Anyone who can write beside a plan could write one naming a
    listed approver and any flow run id.
    """
    approval = load_approval(path)
    if approval.channel is not ApprovalChannel.CLI_SIGNED:
        raise ApprovalError(f"{path}: execution refused: a {approval.channel.value} approval is valid only "
                            "inside the flow run that was resumed, never from a file; approve with "
                            "`denpex approve PLAN --approver NAME --key KEYFILE`; nothing was done")
    return approval
