"""Where approvers are told that a run waits for them: a Slack-compatible incoming webhook."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

__all__ = ["DenpexApprovalWebhook"]


class DenpexApprovalWebhook(Block):
    """An incoming-webhook URL (Slack, Mattermost, ...). The URL is a secret: it lets anyone post."""

    _block_type_slug = "denpex-approval-webhook"
    _block_type_name = "Denpex Approval Webhook"

    url: SecretStr = Field(description="https://hooks.slack.com/services/... or a compatible receiver")
