"""The approval page's signed record, and the page's key.

The approval page (``denpex serve-approvals``) takes one decision per paused run, proved by the
approver's second factor there, and signs it with its own ed25519 key. The record is the one
approval model (``denpex.isolation.approval.Approval``) with channel ``approval-page``; its
signature covers the canonical JSON of every other field (sorted keys, no whitespace)::

    {"approved_at", "approver", "channel": "approval-page", "cluster", "comment",
     "decision": "approve|reject", "expires_at", "flow_run_id", "incident_id", "nodes",
     "operation", "plan_hash", "second_factor": "totp|proxy"}

Keys:

- the private key is the page's alone: ``<state_dir>/approval-page/signing.key`` (created mode
  0600 on the page's first start), or a secret file the page is given (``--signing-key-file``),
  never a Prefect block or a parameter;
- its public half is written beside it (``signing.pub``, one base64 line); whoever checks a
  record reads the public key file the operator's configuration names
  (``$DENPEX_APPROVAL_PAGE_KEY`` on the flow's workers; default the state directory's
  ``approval-page/signing.pub``). A file of several lines holds several keys (rotation).
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from denpex.isolation.ed25519_keys import generate_key, load_private_key, public_key_text, save_private_key
from denpex.isolation.errors import ConfigError
from denpex.isolation.private_files import shared_file_problem
from denpex.isolation.policy import ApprovalRule, SecondFactor

if TYPE_CHECKING:
    from denpex.isolation.approval import Approval

__all__ = ["PAGE_KEY_DIR", "PAGE_PUBLIC_KEY_ENV", "signature_verifies", "page_record_problems",
           "signing_key_path", "public_key_path", "load_or_create_signing_key", "write_public_key", "load_page_public_keys",
           "page_public_key_path"]

PAGE_KEY_DIR = "approval-page"
PAGE_PUBLIC_KEY_ENV = "DENPEX_APPROVAL_PAGE_KEY"
_SIGNING_KEY = "signing.key"
_PUBLIC_KEY = "signing.pub"


def signature_verifies(approval: Approval, keys: Iterable[Ed25519PublicKey]) -> bool:
    """Whether one of ``keys`` (the page's, or an approver's) made ``approval.signature`` over
    ``signed_bytes()``."""
    if not approval.signature:
        return False
    try:
        signature = base64.b64decode(approval.signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    for key in keys:
        try:
            key.verify(signature, approval.signed_bytes())
            return True
        except InvalidSignature:
            continue
    return False


def page_record_problems(approval: Approval, rule: ApprovalRule, keys: Iterable[Ed25519PublicKey],
                         allowed: frozenset[str]) -> list[str]:
    """Why an ``approval-page`` record may not let a plan run (none: it may), besides the binding
    to the plan, cluster and time that every approval gets: the page's signature, an approval
    (a signed rejection never runs anything), a runbook that names approvers here, and the
    second factor the runbook asks for."""
    problems = []
    keys = tuple(keys)
    if not keys:
        problems.append("no approval page public key is configured (DENPEX_APPROVAL_PAGE_KEY, default "
                        f"<state_dir>/{PAGE_KEY_DIR}/{_PUBLIC_KEY}), so no approval-page record can be checked")
    elif not signature_verifies(approval, keys):
        problems.append("the approval page's signature does not verify (forged, edited after signing, or "
                        "signed by another page's key)")
    if approval.decision != "approve":
        problems.append(f"{approval.approver} rejected this plan on the approval page; a signed rejection is final")
    if not allowed:
        problems.append("the runbook names no approvers for this tenant and cluster, so an approval-page "
                        "approval cannot be accepted")
    wanted = {SecondFactor.TOTP: {"totp"}, SecondFactor.PROXY: {"totp", "proxy"}}.get(rule.second_factor)
    if wanted is not None and approval.second_factor not in wanted:
        problems.append(f"the runbook requires approval.second_factor: {rule.second_factor.value}, and the page "
                        f"accepted {approval.approver} with {approval.second_factor or 'nothing'}")
    return problems


def signing_key_path(state_dir: Path) -> Path:
    """Where the page keeps its private key when it is given no secret file."""
    return state_dir / PAGE_KEY_DIR / _SIGNING_KEY


def public_key_path(state_dir: Path) -> Path:
    """The public half, beside the state directory's private key."""
    return state_dir / PAGE_KEY_DIR / _PUBLIC_KEY


def load_or_create_signing_key(path: Path, *, create: bool) -> Ed25519PrivateKey:
    """The page's private key at ``path`` (``create``: made mode 0600 on first use). A key file that
    group or others can read is refused: whoever reads it can sign any decision."""
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            save_private_key(generate_key(), path)
        except ConfigError:
            if not path.exists():  # another page created it first: use theirs
                raise
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the approval page's signing key: {exc.strerror or exc}") from exc
    problem = shared_file_problem(path, mode, "approval page's signing key")
    if problem:
        raise ConfigError(problem)
    return load_private_key(path)


def write_public_key(key: Ed25519PrivateKey, path: Path) -> None:
    """The public half as one base64 line, replaced whole (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(public_key_text(key) + "\n", encoding="ascii")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def load_page_public_keys(path: Path) -> tuple[Ed25519PublicKey, ...]:
    """The page's public keys in ``path``, one base64 line each; none when the file is missing
    (then no page record verifies). Every bad line is named in one ConfigError."""
    try:
        lines = [line.strip() for line in path.read_text(encoding="ascii").splitlines()]
    except FileNotFoundError:
        return ()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the approval page's public key: {exc}") from exc
    keys, bad = [], []
    for number, line in enumerate(lines, 1):
        if not line or line.startswith("#"):
            continue
        try:
            keys.append(Ed25519PublicKey.from_public_bytes(base64.b64decode(line, validate=True)))
        except (binascii.Error, ValueError):
            bad.append(str(number))
    if bad:
        raise ConfigError(f"{path}: line(s) {', '.join(bad)} are not base64 ed25519 public keys")
    return tuple(keys)


def page_public_key_path(environ: Mapping[str, str], state_dir: Path) -> Path:
    """The public key file the operator's configuration names: ``$DENPEX_APPROVAL_PAGE_KEY``, else
    the state directory's. An environment variable of the worker, never a block or a parameter."""
    named = environ.get(PAGE_PUBLIC_KEY_ENV, "").strip()
    return Path(named) if named else public_key_path(state_dir)
