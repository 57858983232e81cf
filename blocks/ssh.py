"""SSH credentials for the Slurm controller or login node. The key is a secret: keep it in the
workers' ``DENPEX_CLUSTER_SECRETS`` folder rather than here (``denpex.isolation.cluster_secrets``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from denpex.evidence.files import write_atomic

__all__ = ["DenpexSshCredentials"]


class DenpexSshCredentials(Block):
    """A user, the pinned host keys and, where the workers keep no credentials folder, a private
    key (SecretStr: redacted in logs and the UI, but given to any Prefect API client that asks)."""

    _block_type_slug = "denpex-ssh-credentials"
    _block_type_name = "Denpex SSH Credentials"

    username: str = "denpex"
    private_key: SecretStr | None = Field(default=None, description=(
        "OpenSSH private key text; leave empty where the workers keep it in DENPEX_CLUSTER_SECRETS "
        "(Prefect gives a block's secrets to any API client)"))
    passphrase: SecretStr | None = None
    known_hosts: str = Field(description="known_hosts lines pinning the host key(s); unknown keys are refused")

    def write_files(self, folder: Path, stem: str, *, key: Path | None = None) -> tuple[Path, Path]:
        """Write known_hosts and, unless ``key`` is the worker's own file, the key (mode 0600);
        return both paths."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Named by its content, never rewritten: a paused run reads its pins when it connects,
        # and a later run of a block an API writer edited must not change them under it.
        pins = (self.known_hosts.rstrip("\n") + "\n").encode()
        known = folder / f"{stem}.{hashlib.sha256(pins).hexdigest()[:16]}.known_hosts"
        if not known.is_file():
            write_atomic(known, pins)
        if key is not None:
            # A copy an earlier run wrote from the block goes: that key was in Prefect (rotate it).
            (folder / f"{stem}.key").unlink(missing_ok=True)
            return key, known
        assert self.private_key is not None, "the caller checked that the block carries the key"
        written = folder / f"{stem}.key"
        fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self.private_key.get_secret_value().rstrip("\n") + "\n")
        return written, known
