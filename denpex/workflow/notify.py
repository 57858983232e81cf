"""Tell the approvers that a run waits for them: a Slack-compatible incoming-webhook message.

The body is ``{"text": ...}`` (what Slack, Mattermost and most chat webhooks accept) with the
verdict, the proposed actions and the link to the paused run::

    {"text": "Denpex: incident inc-7 on cluster lab waits for approval: drain gpu-node-003 ...\n<link>"}
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from pydantic import BaseModel, ConfigDict

from denpex.markdown_text import chat_text
from denpex.report import TriageReport

__all__ = ["ApprovalNotice", "approval_notice", "NotifyError", "post_webhook"]


class NotifyError(Exception):
    """The webhook could not be reached or refused the message."""


class ApprovalNotice(BaseModel):
    """The message, kept apart from sending it."""

    model_config = ConfigDict(frozen=True)

    text: str

    def payload(self) -> dict[str, Any]:
        return {"text": self.text}


def approval_notice(report: TriageReport, *, incident_id: str, cluster: str, run_url: str | None,
                    plan_hash: str) -> ApprovalNotice:
    """One short message: what is proposed, why, and where to approve it."""
    actions = ", ".join(f"{a.action} {chat_text(a.node)}" for a in report.plan.actions) or "no action"
    culprits = ", ".join(f"rank {c.rank} ({c.kind.value}{' on ' + chat_text(c.host, limit=100) if c.host else ''})"
                         for c in report.candidates[:4]) or "no culprit"
    lines = [
        f"Denpex: incident {chat_text(incident_id)} on cluster {chat_text(cluster)} waits for approval: {actions}.",
        f"Verdict {report.verdict.value}: {culprits}. Plan {plan_hash[:12]}.",
        f"Approve or reject: {run_url}" if run_url else "Approve or reject it in the Prefect UI.",
    ]
    return ApprovalNotice(text="\n".join(lines))


def post_webhook(url: str, notice: ApprovalNotice, *, timeout_s: float = 10.0) -> int:
    """POST the notice as JSON; return the HTTP status. Raises NotifyError on failure."""
    if not url.startswith(("https://", "http://")):
        raise NotifyError(f"webhook URL {url[:40]!r} is not http(s)")
    request = urllib.request.Request(
        url, data=json.dumps(notice.payload()).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 (scheme checked)
            status: int = response.status
    except urllib.error.HTTPError as exc:
        raise NotifyError(f"the approvers' webhook answered HTTP {exc.code}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise NotifyError(f"the approvers' webhook could not be reached: {exc}") from exc
    return status
