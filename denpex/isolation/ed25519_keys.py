"""ed25519 key files: an approver's signing key (``denpex approver keygen``) and the approval
page's (``denpex serve-approvals``). A private key is PEM (PKCS#8), created readable by its owner
only and never overwritten; a public key travels as one line of base64 (the raw 32 bytes)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from denpex.isolation.errors import ConfigError

__all__ = ["generate_key", "public_key_text", "save_private_key", "load_private_key"]


def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The raw 32-byte public key in base64: one line for the trusted approvers file."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def save_private_key(key: Ed25519PrivateKey, path: Path) -> None:
    """PEM (PKCS#8), created readable by its owner only; an existing file is never overwritten."""
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise ConfigError(f"{path} exists; choose another --out or remove it first") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot create key file: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read key: {exc.strerror or exc}") from exc
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: not an unencrypted PEM private key ({exc}); make one with "
                          "`denpex approver keygen --out FILE`") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{path}: an approval key must be ed25519, not {type(key).__name__}")
    return key
