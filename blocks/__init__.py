"""Prefect Blocks for Denpex's configuration and secrets.

Blocks say where things are and hold secrets (SSH keys, API tokens, webhook URLs). Policy
(limits, approvers, channels) never lives here: ``DenpexRunbook`` only names which operator-
reviewed runbook file to use. ``python -m blocks.register`` registers the types and local defaults.
"""

from blocks.evidence import DenpexEvidenceStore
from blocks.notify import DenpexApprovalWebhook
from blocks.runbook import DenpexRunbook
from blocks.ssh import DenpexSshCredentials
from blocks.targets import DenpexKubernetesTarget, DenpexSlurmTarget, block_name_for

__all__ = ["DenpexEvidenceStore", "DenpexApprovalWebhook", "DenpexRunbook", "DenpexSshCredentials",
           "DenpexSlurmTarget", "DenpexKubernetesTarget", "block_name_for", "ALL_BLOCK_TYPES"]

ALL_BLOCK_TYPES = (DenpexEvidenceStore, DenpexApprovalWebhook, DenpexRunbook, DenpexSshCredentials,
                   DenpexSlurmTarget, DenpexKubernetesTarget)
