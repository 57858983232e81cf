"""What a run tells the world: Prefect events about its incident (part of the audit trail) and
the approvers' webhook."""

from __future__ import annotations

import os
from typing import Any

from prefect.events import emit_event

from blocks.notify import DenpexApprovalWebhook
from flows._shared.run import load_block, run_id

__all__ = ["emit", "webhook_url"]


def emit(event: str, incident_id: str, cluster: str, payload: dict[str, Any]) -> None:
    """A Prefect event about this incident (the event feed is part of the audit trail)."""
    emit_event(
        event=event,
        resource={"prefect.resource.id": f"denpex.incident.{incident_id}", "denpex.cluster": cluster},
        related=[{"prefect.resource.id": f"prefect.flow-run.{run_id()}", "prefect.resource.role": "flow-run"}],
        payload=payload,
    )


def webhook_url() -> str | None:
    block = load_block(DenpexApprovalWebhook, "approvers")
    return block.url.get_secret_value() if block else os.environ.get("DENPEX_APPROVAL_WEBHOOK_URL") or None
