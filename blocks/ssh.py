"""SSH credentials for the Slurm controller or login node. The key is a secret."""

from __future__ import annotations

import os
from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

__all__ = ["DenpexSshCredentials"]


class DenpexSshCredentials(Block):
    """A user, a private key (SecretStr: redacted in logs and the UI) and the pinned host keys."""

    _block_type_slug = "denpex-ssh-credentials"
    _block_type_name = "Denpex SSH Credentials"

    username: str = "denpex"
    private_key: SecretStr = Field(description="OpenSSH private key text")
    passphrase: SecretStr | None = None
    known_hosts: str = Field(description="known_hosts lines pinning the host key(s); unknown keys are refused")

    def write_files(self, folder: Path, stem: str) -> tuple[Path, Path]:
        """Write the key (mode 0600) and known_hosts for paramiko; return both paths."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = folder / f"{stem}.key"
        known = folder / f"{stem}.known_hosts"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self.private_key.get_secret_value().rstrip("\n") + "\n")
        known.write_text(self.known_hosts.rstrip("\n") + "\n")
        return key, known
