"""Errors raised while planning, approving, executing or auditing an isolation.

Expected outcomes (a gate blocks a node, a node is already drained) are values in the plan or
the execution report, never exceptions. These classes are for bad input and for the outside
world failing::

    IsolationError              anything in this package
    ├── PlanError               a plan file is unreadable or invalid
    ├── RefusedError            a safety check refused execution: never retried, nothing was done
    │   ├── ApprovalError       no approval, or one that is unauthenticated, foreign, for another
    │   │                       plan, operation, cluster or node set, or expired
    │   ├── PolicyMismatchError the plan's policy is not the operator's, or its verdict or
    │   │                       evidence does not support its actions
    │   └── AuditChainError     the audit log's chain or keys are broken, or the log does not
    │                           extend the stored copy
    ├── ConfigError             SSH / cluster / store settings missing or invalid
    ├── RunbookError            a runbook file is unreadable or invalid
    ├── AuditError              the audit log cannot be read or written, or its chain is broken
    ├── BusyError               another run is acting on the same audit log right now
    ├── StoreError              the audit log cannot be copied to the evidence store
    └── RemoteError             a remote command or API call failed
        ├── TransientRemoteError    connection refused, dropped or timed out: worth a retry
        │   └── OutcomeUnknownError dropped after a changing command was sent: read state first
        ├── HostKeyError            unknown or changed host key: never retried
        ├── RemoteAuthError         the key or token was refused: never retried
        └── CommandFailedError      the command ran and failed (non-zero rc, API error)
"""

from __future__ import annotations

__all__ = [
    "IsolationError",
    "PlanError",
    "RefusedError",
    "ApprovalError",
    "PolicyMismatchError",
    "AuditChainError",
    "is_transient",
    "ConfigError",
    "RunbookError",
    "AuditError",
    "BusyError",
    "StoreError",
    "RemoteError",
    "TransientRemoteError",
    "OutcomeUnknownError",
    "HostKeyError",
    "RemoteAuthError",
    "CommandFailedError",
]


class IsolationError(Exception):
    """Anything that went wrong in planning or carrying out an isolation."""


class PlanError(IsolationError):
    """A plan file is unreadable or does not validate."""


class RefusedError(IsolationError):
    """A safety check refused to execute; nothing was done. Retrying cannot help: a person must
    look (approve the current plan, fix the configuration, inspect the audit log)."""


class ApprovalError(RefusedError):
    """Execution was refused: no approval, an unauthenticated or foreign one, one for a different
    plan, operation, cluster or node set, or an expired one."""


class PolicyMismatchError(RefusedError):
    """The plan carries a policy other than the operator's, or a verdict or evidence that does
    not support its actions."""


class ConfigError(IsolationError):
    """SSH, cluster or store settings are missing or invalid."""


class RunbookError(IsolationError):
    """A runbook file is unreadable or does not validate."""


class AuditError(IsolationError):
    """The audit log cannot be read or written, or its hash chain is broken."""


class AuditChainError(RefusedError, AuditError):
    """The audit log's chain or keyed MACs are broken, or it does not extend the stored copy."""


class BusyError(IsolationError):
    """Another run holds the audit log's run lock; acting now could send a command twice."""


class StoreError(IsolationError):
    """The audit log could not be copied to the evidence store."""


class RemoteError(IsolationError):
    """A remote command or API call failed."""


class TransientRemoteError(RemoteError):
    """The connection was refused, dropped or timed out; retrying may succeed."""


class OutcomeUnknownError(TransientRemoteError):
    """The connection dropped after a changing command was sent; it may or may not have run.

    Callers read the node's real state before deciding to send it again.
    """


class HostKeyError(RemoteError):
    """The host key is unknown or differs from known_hosts; nothing was sent."""


class RemoteAuthError(RemoteError):
    """The remote side refused our credentials; nothing was sent."""


class CommandFailedError(RemoteError):
    """The command ran and failed; the message carries its rc and output."""


class UnreadableRecordError(RemoteError):
    """The command ran, but its answer cannot be read safely (a field named twice by the user's own
    text, a hostile host list); nothing is decided on it."""


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same call later may succeed: a dropped or refused connection, or another
    run holding the lock. Refusals, bad input and rejected credentials are never transient.
    """
    return isinstance(exc, TransientRemoteError | BusyError)



