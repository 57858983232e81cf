"""Tell the approvers that a run waits for them (a Slack-compatible webhook)."""

from __future__ import annotations

from prefect import task
from prefect.logging import get_run_logger

from denpex.workflow.notify import ApprovalNotice, NotifyError, post_webhook
from tasks.options import NOT_CACHED

__all__ = ["notify_approvers"]


@task(name="notify-approvers", **NOT_CACHED)
def notify_approvers(url: str, notice: ApprovalNotice) -> int | None:
    """Post the notice; a webhook that stays down is logged, never a reason to skip the approval."""
    try:
        return post_webhook(url, notice)
    except NotifyError as exc:
        get_run_logger().warning("approvers were not notified: %s", exc)
        return None
