"""Where the executor reaches the cluster and keeps its state, from a file and the environment.

A YAML (or JSON) file gives the settings; ``DENPEX_*`` environment variables override single
values, so a CI job or a Prefect worker can point at another cluster without a file::

    ssh:
      host: slurm-login.example.org
      port: 22
      username: denpex
      key_path: /etc/denpex/id_ed25519
      known_hosts: /etc/denpex/known_hosts
    state_dir: /var/lib/denpex          # default: $DENPEX_STATE_DIR, else /var/lib/denpex
    runbook: /etc/denpex/runbooks/gpu-hardware-fault.yaml   # default: the built-in safe policy
    trusted_approvers: /etc/denpex/approvers.yaml            # approvers' ed25519 public keys
    cluster: gpu-prod                   # only where the cluster cannot say its own name
    evidence_store: s3://incidents/denpex   # each run's incident also gets a copy of the log here
    audit_store: s3://audit/denpex      # the audit log's checked copy, one per cluster;
                                        # default: <state_dir>/audit-store

The breaker, the run lock, the audit log and its HMAC key live in the one machine-wide state
directory (``denpex.state_dir``); it must be absolute, so that every operator shares them.

Environment: DENPEX_SSH_HOST, DENPEX_SSH_PORT, DENPEX_SSH_USER, DENPEX_SSH_KEY,
DENPEX_SSH_KNOWN_HOSTS, DENPEX_KUBECONFIG, DENPEX_KUBE_CONTEXT, DENPEX_KUBE_HOST,
DENPEX_KUBE_TOKEN, DENPEX_KUBE_CA_CERT, DENPEX_RUNBOOK, DENPEX_TRUSTED_APPROVERS, DENPEX_CLUSTER,
DENPEX_EVIDENCE_STORE, DENPEX_AUDIT_STORE (and DENPEX_STATE_DIR, read by ``resolve_state_dir``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from denpex.evidence.loading import FileKind, read_mapping, validated
from denpex.isolation.errors import ConfigError
from denpex.isolation.ssh import Backoff, SshSettings

__all__ = ["KubernetesSettings", "IsolationSettings", "load_settings", "where_commands_go"]

_MAX_SETTINGS_BYTES = 1024 * 1024
_SETTINGS_FILE = FileKind("the settings file")
_SETTINGS = FileKind("isolation settings", invalid="invalid isolation settings")
_ENV: dict[str, tuple[str, ...]] = {
    "DENPEX_SSH_HOST": ("ssh", "host"),
    "DENPEX_SSH_PORT": ("ssh", "port"),
    "DENPEX_SSH_USER": ("ssh", "username"),
    "DENPEX_SSH_KEY": ("ssh", "key_path"),
    "DENPEX_SSH_KNOWN_HOSTS": ("ssh", "known_hosts"),
    "DENPEX_KUBECONFIG": ("kubernetes", "kubeconfig"),
    "DENPEX_KUBE_CONTEXT": ("kubernetes", "context"),
    "DENPEX_KUBE_HOST": ("kubernetes", "host"),
    "DENPEX_KUBE_TOKEN": ("kubernetes", "token"),
    "DENPEX_KUBE_CA_CERT": ("kubernetes", "ca_cert"),
    "DENPEX_RUNBOOK": ("runbook",),
    "DENPEX_TRUSTED_APPROVERS": ("trusted_approvers",),
    "DENPEX_CLUSTER": ("cluster",),
    "DENPEX_EVIDENCE_STORE": ("evidence_store",),
    "DENPEX_AUDIT_STORE": ("audit_store",),
}


class KubernetesSettings(BaseModel):
    """How to reach the API server: a kubeconfig (and context), or a host and bearer token."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kubeconfig: Path | None = None
    context: str | None = None
    host: str | None = None
    token: SecretStr | None = None
    ca_cert: Path | None = None
    verify_tls: bool = True
    request_timeout_s: float = Field(default=10.0, gt=0)
    backoff: Backoff = Backoff()
    eviction_timeout_s: float = Field(default=120.0, gt=0)
    """How long evictions refused by a PodDisruptionBudget (HTTP 429) are retried."""


class IsolationSettings(BaseModel):
    """Everything ``denpex isolate`` needs besides the plan and its approval."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ssh: SshSettings | None = None
    kubernetes: KubernetesSettings | None = None
    state_dir: Path | None = None
    """The machine-wide state directory; None: ``$DENPEX_STATE_DIR``, else ``/var/lib/denpex``."""
    runbook: Path | None = None
    """The operator's runbook: the policy every execution enforces. None: the built-in safe policy."""
    trusted_approvers: Path | None = None
    """The approvers' ed25519 public keys (YAML ``approvers: {NAME: KEY}``)."""
    cluster: str | None = Field(default=None, min_length=1, max_length=200)
    """The cluster's name, for a connection that cannot say it (a bare Kubernetes host)."""
    slurm_user: str | None = Field(default=None, min_length=1, max_length=64)
    """The user Slurm records for Denpex's drains (``Reason=... [user@time]``); default: the SSH
    user. Set it when commands run through sudo. A drain another user set is never Denpex's."""
    evidence_store: str | None = None
    """A folder or ``s3://bucket/prefix``; the audit log is copied under ``audit/<incident>/`` there
    after each run, beside the incident's evidence. Nothing is checked against that copy."""
    audit_store: str | None = Field(default=None, min_length=1)
    """A folder or ``s3://bucket/prefix`` for the audit log's checked copy, one per cluster
    (``denpex.isolation.audit_store``). None: ``$DENPEX_AUDIT_STORE``, else ``<state_dir>/audit-store``.
    Best somewhere the service user can add to but not rewrite (an S3 bucket with versioning or
    object lock): a copy beside the log can be cut with it."""
    verify_timeout_s: float = Field(default=20.0, gt=0)


def where_commands_go(settings: IsolationSettings) -> str:
    """Where an approved plan's commands will be sent, in one line for the approver. The target
    block says it, and an API writer may edit a block: the approver sees it beside the decision."""
    if settings.ssh is not None:
        ssh = settings.ssh
        host = f"[{ssh.host}]" if ":" in ssh.host else ssh.host
        return f"Slurm commands over SSH to {ssh.username}@{host}:{ssh.port}"
    k8s = settings.kubernetes
    if k8s is not None and k8s.host:
        return f"the Kubernetes API at {k8s.host}"
    if k8s is not None:
        context = f", context {k8s.context}" if k8s.context else ""
        return f"the Kubernetes API of the worker's kubeconfig{context}"
    return ""


def _set(tree: dict[str, Any], path: tuple[str, ...], value: str) -> None:
    node = tree
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def load_settings(path: Path | None, environ: Mapping[str, str]) -> IsolationSettings:
    """Read ``path`` (if given), apply ``DENPEX_*`` overrides, validate; all problems in one error."""
    tree: dict[str, Any] = {}
    if path is not None:
        tree = read_mapping(path, max_bytes=_MAX_SETTINGS_BYTES, kind=_SETTINGS_FILE, error=ConfigError,
                            syntax="yaml", empty_ok=True)
    for name, target in _ENV.items():
        if environ.get(name):
            _set(tree, target, environ[name])
    where = f"{path} and the environment" if path else "the environment"
    return validated(IsolationSettings, tree, where, _SETTINGS, ConfigError)
