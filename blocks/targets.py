"""The clusters the flow may act on, one block per cluster, named after it.

``block_name_for("lab")`` -> ``"lab"``; ``"Prod East/1"`` -> ``"prod-east-1"``. The flow looks up
``denpex-slurm-target/<name>``, then ``denpex-kubernetes-target/<name>``, and uses the block only
when its ``cluster_name`` is the incident's cluster exactly and the operator's registry does not
give that cluster to another tenant (``denpex.tenancy``): a block says where a cluster is, never
whose it is, since anyone who reaches the Prefect API can edit it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from blocks.ssh import DenpexSshCredentials
from denpex.isolation.cluster_secrets import cluster_secrets_dir, refuse_block_secret, worker_secret_file
from denpex.isolation.config import IsolationSettings, KubernetesSettings
from denpex.isolation.errors import ConfigError
from denpex.isolation.ssh import SshSettings
from denpex.tenancy import cluster_slug

__all__ = ["block_name_for", "DenpexSlurmTarget", "DenpexKubernetesTarget"]


def block_name_for(cluster: str) -> str:
    """A block name (lowercase letters, digits, dashes) for a cluster name; the registry refuses a
    second cluster whose name makes the same one."""
    return cluster_slug(cluster)


def _state_settings(state_dir: Path, runbook: Path, cluster: str, **fields: object) -> IsolationSettings:
    """The operator's settings: the machine-wide state directory and the runbook file (policy).

    No audit store: where the audit log's copy lives is the operator's configuration
    (``DENPEX_AUDIT_STORE``, else a folder in the state directory), never a block's field.
    """
    return IsolationSettings.model_validate({"state_dir": state_dir, "runbook": runbook, "cluster": cluster,
                                             **fields})


class DenpexSlurmTarget(Block):
    """A Slurm cluster reached over SSH on a node that runs ``scontrol``."""

    _block_type_slug = "denpex-slurm-target"
    _block_type_name = "Denpex Slurm Target"

    cluster_name: str = Field(description="Slurm ClusterName, exactly as the ingest registry holds it")
    host: str
    port: int = Field(default=22, ge=1, le=65535)
    credentials: DenpexSshCredentials
    connect_timeout_s: float = Field(default=10.0, gt=0)
    command_timeout_s: float = Field(default=60.0, gt=0)

    def settings(self, state_dir: Path, runbook: Path, environ: Mapping[str, str]) -> IsolationSettings:
        """The executor's settings. The key is the worker's own file where ``environ`` names a
        credentials folder (a block then carrying one is refused), else the block's, written
        under the state directory; known_hosts is written there either way."""
        slug = block_name_for(self.cluster_name)
        folder = cluster_secrets_dir(environ)
        refuse_block_secret(folder, carried=_carried(self.credentials.private_key), what="SSH private key",
                            cluster=self.cluster_name)
        own = worker_secret_file(folder, slug, "ssh-key")[0] if folder else None
        key, known = self.credentials.write_files(state_dir / "keys", f"slurm-{slug}", key=own)
        ssh = SshSettings(host=self.host, port=self.port, username=self.credentials.username, key_path=key,
                          key_passphrase=self.credentials.passphrase, known_hosts=known,
                          connect_timeout_s=self.connect_timeout_s, command_timeout_s=self.command_timeout_s)
        return _state_settings(state_dir, runbook, self.cluster_name, ssh=ssh)


class DenpexKubernetesTarget(Block):
    """A Kubernetes cluster: API server and bearer token (SecretStr), with its CA pinned."""

    _block_type_slug = "denpex-kubernetes-target"
    _block_type_name = "Denpex Kubernetes Target"

    cluster_name: str = Field(description="The cluster's name, exactly as the ingest registry holds it")
    host: str = Field(description="https://api-server:6443")
    token: SecretStr | None = Field(default=None, description=(
        "Bearer token; leave empty where the workers keep it in DENPEX_CLUSTER_SECRETS (Prefect gives a "
        "block's secrets to any API client)"))
    ca_cert_pem: str | None = Field(default=None, description="The API server's CA (PEM)")

    def settings(self, state_dir: Path, runbook: Path, environ: Mapping[str, str]) -> IsolationSettings:
        """The executor's settings: the token from the worker's credentials folder where
        ``environ`` names one (a block then carrying one is refused), else the block's."""
        folder = cluster_secrets_dir(environ)
        refuse_block_secret(folder, carried=_carried(self.token), what="API token", cluster=self.cluster_name)
        if folder is not None:
            return self._with_workers_token(folder, state_dir, runbook)
        ca = None
        if self.ca_cert_pem:
            ca = state_dir / "keys" / f"kube-{block_name_for(self.cluster_name)}.ca.pem"
            ca.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            ca.write_text(self.ca_cert_pem)
        kube = KubernetesSettings(host=self.host, token=self.token, ca_cert=ca)
        return _state_settings(state_dir, runbook, self.cluster_name, kubernetes=kube)

    def _with_workers_token(self, folder: Path, state_dir: Path, runbook: Path) -> IsolationSettings:
        """The worker's token, sent only over https under the worker's CA: the block's ``host``
        is the API writer's, and an address of theirs must not receive the token."""
        slug = block_name_for(self.cluster_name)
        if not self.host.lower().startswith("https://"):
            raise ConfigError(f"the target block of cluster {self.cluster_name!r} names {self.host[:200]!r}; "
                              "this worker sends its token to an https:// API server only")
        _, token = worker_secret_file(folder, slug, "kube-token")
        ca, pem = worker_secret_file(folder, slug, "kube-ca.pem")
        if self.ca_cert_pem and self.ca_cert_pem.strip() != pem:
            raise ConfigError(f"the target block of cluster {self.cluster_name!r} names another CA than this "
                              f"worker's {ca.name}; remove it from the block")
        kube = KubernetesSettings(host=self.host, token=SecretStr(token), ca_cert=ca)
        return _state_settings(state_dir, runbook, self.cluster_name, kubernetes=kube)


def _carried(secret: SecretStr | None) -> bool:
    """Whether a block holds a credential: an empty field (a cleared form) holds none."""
    return secret is not None and bool(secret.get_secret_value().strip())
