"""Prefect Blocks for Denpex's configuration and secrets.

Blocks say where things are and hold secrets (SSH keys, API tokens, webhook URLs). Policy
(limits, approvers, channels) never lives here: ``DenpexRunbook`` only names which operator-
reviewed runbook file to use. ``python -m blocks.register`` registers the types and local defaults.

Names are imported on first use: the evidence store block pulls in prefect-aws (seconds to
import), and a flow run that only loads its targets should not pay for it before its first task.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from blocks.evidence import DenpexEvidenceStore
    from blocks.notify import DenpexApprovalWebhook
    from blocks.runbook import DenpexRunbook
    from blocks.ssh import DenpexSshCredentials
    from blocks.targets import DenpexKubernetesTarget, DenpexSlurmTarget, block_name_for

__all__ = ["DenpexEvidenceStore", "DenpexApprovalWebhook", "DenpexRunbook", "DenpexSshCredentials",
           "DenpexSlurmTarget", "DenpexKubernetesTarget", "block_name_for", "all_block_types"]

_WHERE = {"DenpexEvidenceStore": "blocks.evidence", "DenpexApprovalWebhook": "blocks.notify",
          "DenpexRunbook": "blocks.runbook", "DenpexSshCredentials": "blocks.ssh",
          "DenpexSlurmTarget": "blocks.targets", "DenpexKubernetesTarget": "blocks.targets",
          "block_name_for": "blocks.targets"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'blocks' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


def all_block_types() -> tuple[Any, ...]:
    """Every Denpex block type, for registration."""
    return tuple(getattr(importlib.import_module(_WHERE[n]), n) for n in _WHERE if n != "block_name_for")
