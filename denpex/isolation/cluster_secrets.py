"""Where a cluster's credential (the SSH key to its Slurm controller, the Kubernetes token) is
kept: a folder in the worker's own environment, never a Prefect block.

Prefect's API gives a block's secret fields to any client that asks (``include_secrets``), so a
key kept in a target block is every API user's: a red team read the lab's SSH key that way and
drained a node without Denpex. With ``DENPEX_CLUSTER_SECRETS`` set on the workers, the block says
where the cluster is and the folder holds its credential, one file per cluster::

    $DENPEX_CLUSTER_SECRETS/<cluster-slug>.ssh-key      OpenSSH private key
    $DENPEX_CLUSTER_SECRETS/<cluster-slug>.kube-token   bearer token
    $DENPEX_CLUSTER_SECRETS/<cluster-slug>.kube-ca.pem  the API server's CA, which the token is sent under

each a regular file (no link), owned by the worker's user, mode 0600, not empty; and a block that
still carries a credential is refused there, before anything connects. The token goes only to an
``https`` API server whose certificate that CA signed: a block's ``host`` is the API writer's, and
an address they chose would otherwise receive it. Without the variable, a block's own credential
is used as before.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from denpex.isolation.errors import ConfigError
from denpex.isolation.private_files import shared_file_problem

__all__ = ["SECRETS_ENV", "SecretKind", "cluster_secrets_dir", "worker_secret_file", "worker_secret_files",
           "refuse_block_secret"]

SECRETS_ENV = "DENPEX_CLUSTER_SECRETS"
SecretKind = Literal["ssh-key", "kube-token", "kube-ca.pem"]


def cluster_secrets_dir(environ: Mapping[str, str]) -> Path | None:
    """The worker's credentials folder (absolute), or None when the variable is not set."""
    named = environ.get(SECRETS_ENV, "").strip()
    if not named:
        return None
    folder = Path(named)
    if not folder.is_absolute():
        raise ConfigError(f"{SECRETS_ENV}={named!r} must be an absolute folder")
    return folder


def worker_secret_file(folder: Path, cluster_slug: str, kind: SecretKind) -> tuple[Path, str]:
    """The cluster's credential file in ``folder`` and its text: a regular file (not a link),
    the worker's own, mode 0600 or stricter, readable and not empty. Any other is a ConfigError
    naming the file, never its content."""
    path = folder / f"{cluster_slug}.{kind}"
    try:
        found = path.lstat()
    except OSError as exc:
        raise ConfigError(f"{path}: no {kind} for cluster {cluster_slug!r} in {SECRETS_ENV} "
                          f"({exc.strerror or exc})") from exc
    if not stat.S_ISREG(found.st_mode):
        raise ConfigError(f"{path}: not a regular file (a link or a folder is refused)")
    problem = shared_file_problem(path, found.st_mode, kind)
    if problem:
        raise ConfigError(problem)
    if found.st_uid != os.geteuid():
        raise ConfigError(f"{path}: owned by uid {found.st_uid}, not by this worker's user ({os.geteuid()})")
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the {kind} ({getattr(exc, 'strerror', None) or exc})") from exc
    if not text:
        raise ConfigError(f"{path}: the {kind} is empty")
    return path, text


def worker_secret_files(folder: Path | None) -> list[Path]:
    """Every credential file in ``folder`` (none when it is unset or cannot be listed)."""
    if folder is None:
        return []
    try:
        return sorted(p for p in folder.iterdir() if p.name.endswith((".ssh-key", ".kube-token")))
    except OSError:
        return []


def refuse_block_secret(folder: Path | None, *, carried: bool, what: str, cluster: str) -> None:
    """ConfigError when the block carries ``what`` although the worker keeps credentials in
    ``folder``, or carries none and the worker keeps none."""
    if folder is not None and carried:
        raise ConfigError(f"the target block of cluster {cluster!r} carries its {what}, which Prefect gives to any "
                          f"API client that asks; remove it from the block: this worker reads it from its "
                          f"{SECRETS_ENV} folder")
    if folder is None and not carried:
        raise ConfigError(f"the target block of cluster {cluster!r} carries no {what}, and this worker sets no "
                          f"{SECRETS_ENV} folder to read it from")
