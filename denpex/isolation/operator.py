"""The operator's trusted configuration: the only source of policy at execution time.

A plan file (and anything editable through the Prefect API) is input to be checked, never a source
of rules. What the executor trusts is what the operator owns on the machine that acts:

- the runbook (limits, approvers, channels, steps), or the built-in safe policy;
- the approvers' ed25519 public keys, and the approval page's (``denpex.isolation.page_record``);
- the machine-wide state directory (absolute): breaker, run lock, audit log and its HMAC key;
- where the audit log is copied (the audit store: its checked copy, one per cluster; and the
  evidence store: a copy per incident), and the cluster's name where the connection cannot tell it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from denpex.isolation.approval import TrustedApprovers, load_trusted_approvers
from denpex.isolation.audit import AuditLog, load_or_create_audit_key
from denpex.isolation.breaker import CircuitBreaker
from denpex.isolation.config import IsolationSettings
from denpex.isolation.errors import ConfigError
from denpex.isolation.page_record import load_page_public_keys, page_public_key_path
from denpex.isolation.policy import IsolationPolicy
from denpex.isolation.runbook import load_runbook
from denpex.state_dir import StateDirError, resolve_state_dir

__all__ = ["AUDIT_LOG_NAME", "BREAKER_NAME", "AUDIT_KEY_NAME", "AUDIT_STORE_ENV", "AUDIT_STORE_DIR_NAME",
           "OperatorConfig", "load_operator_config", "resolve_audit_store", "state_audit_log"]

AUDIT_LOG_NAME = "audit.jsonl"
BREAKER_NAME = "breaker.json"
AUDIT_KEY_NAME = "audit.key"
AUDIT_STORE_ENV = "DENPEX_AUDIT_STORE"
AUDIT_STORE_DIR_NAME = "audit-store"
"""The default audit store, in the state directory: a single machine keeps a checked copy unconfigured."""


@dataclass(frozen=True)
class OperatorConfig:
    """What execution trusts. Build it with ``load_operator_config`` (CLI) or directly (the flow)."""

    state_dir: Path
    """Absolute; relative paths are refused (each working directory would get its own state)."""
    policy: IsolationPolicy = IsolationPolicy()
    """From the operator's runbook (``Runbook.policy()``)."""
    trusted: TrustedApprovers = field(default_factory=TrustedApprovers)
    cluster: str | None = None
    """The cluster's name where the adapter cannot say it (a bare Kubernetes host and token)."""
    evidence_store: str | None = None
    """A folder or ``s3://bucket/prefix`` for each incident's copy of the audit log (not checked)."""
    audit_store: str | None = None
    """A folder or ``s3://bucket/prefix`` for the audit log's checked copy, one per cluster; None:
    ``<state_dir>/audit-store``. Every action refuses a log that does not extend it."""
    verify_timeout_s: float = 20.0
    poll_s: float = 0.2

    def __post_init__(self) -> None:
        if not self.state_dir.is_absolute():
            raise ConfigError(
                f"the state directory {str(self.state_dir)!r} is relative; set DENPEX_STATE_DIR (or "
                "`state_dir:` in the settings) to an absolute path so that every operator on this "
                "machine shares one breaker, lock and audit log"
            )

    @property
    def audit_path(self) -> Path:
        return self.state_dir / AUDIT_LOG_NAME

    @property
    def breaker_path(self) -> Path:
        return self.state_dir / BREAKER_NAME

    @property
    def audit_key_path(self) -> Path:
        return self.state_dir / AUDIT_KEY_NAME

    @property
    def audit_store_uri(self) -> str:
        return self.audit_store or str(self.state_dir / AUDIT_STORE_DIR_NAME)

    def audit_log(self) -> AuditLog:
        """The keyed audit log; its key is created (mode 0600) on first use."""
        return state_audit_log(self.state_dir)

    def breaker(self) -> CircuitBreaker:
        return CircuitBreaker(self.breaker_path)


def state_audit_log(state_dir: Path) -> AuditLog:
    """The state directory's audit log with its HMAC key: every writer must append through this,
    or its records carry no mac and the next execution refuses the whole log."""
    return AuditLog(state_dir / AUDIT_LOG_NAME, key=load_or_create_audit_key(state_dir / AUDIT_KEY_NAME))


def resolve_audit_store(explicit: str | None, state_dir: Path,
                        environ: Mapping[str, str] | None = None) -> str:
    """Where the audit log's checked copy lives: ``explicit`` (the settings file), else
    ``$DENPEX_AUDIT_STORE``, else ``<state_dir>/audit-store``.

    The flow builds its settings from a target block, which has no say here: every writer on the
    machine (the flow's decisions, its executions, the CLI) must find the same copy, so only the
    operator's own configuration names it.
    """
    env = os.environ if environ is None else environ
    return explicit or env.get(AUDIT_STORE_ENV) or str(state_dir / AUDIT_STORE_DIR_NAME)


def load_operator_config(settings: IsolationSettings, environ: Mapping[str, str]) -> OperatorConfig:
    """The operator's configuration from their settings: runbook, trusted keys, state directory."""
    try:
        state_dir = resolve_state_dir(settings.state_dir, environ)
    except StateDirError as exc:
        raise ConfigError(str(exc)) from exc
    for trusted_file in (settings.runbook, settings.trusted_approvers):
        if trusted_file is not None:
            _refuse_shared_write(trusted_file)
    policy = load_runbook(settings.runbook).policy() if settings.runbook else IsolationPolicy()
    trusted = load_trusted_approvers(settings.trusted_approvers) if settings.trusted_approvers \
        else TrustedApprovers()
    page_keys = load_page_public_keys(page_public_key_path(environ, state_dir))
    if page_keys:
        trusted = TrustedApprovers({name: trusted.keys_of(name) for name in trusted.names()}, page_keys)
    return OperatorConfig(state_dir=state_dir, policy=policy, trusted=trusted, cluster=settings.cluster,
                          evidence_store=settings.evidence_store,
                          audit_store=resolve_audit_store(settings.audit_store, state_dir, environ),
                          verify_timeout_s=settings.verify_timeout_s)


def _refuse_shared_write(path: Path) -> None:
    """A runbook or trusted approvers file that group or others may write is not the operator's:
    anyone on the machine could substitute their own policy or approver key."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # the loader says what is wrong with a missing or unreadable file
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"{path}: group or others may write it (mode {stat.S_IMODE(mode):o}), so it is not "
                          f"trusted; run `chmod go-w {path}` as its owner")
