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
        refuse_block_secret(folder, carried=self.credentials.private_key is not None, what="SSH private key",
                            cluster=self.cluster_name)
        own = worker_secret_file(folder, slug, "ssh-key") if folder else None
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
        refuse_block_secret(folder, carried=self.token is not None, what="API token", cluster=self.cluster_name)
        token = self.token
        if folder is not None:
            path = worker_secret_file(folder, block_name_for(self.cluster_name), "kube-token")
            token = SecretStr(path.read_text().strip())
        ca = None
        if self.ca_cert_pem:
            ca = state_dir / "keys" / f"kube-{block_name_for(self.cluster_name)}.ca.pem"
            ca.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            ca.write_text(self.ca_cert_pem)
        kube = KubernetesSettings(host=self.host, token=token, ca_cert=ca)
        return _state_settings(state_dir, runbook, self.cluster_name, kubernetes=kube)
