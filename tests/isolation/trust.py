"""What the isolation tests share about trust: approvers' keys, the operator's configuration,
and signed approvals made the way `denpex approve --key` makes them."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from denpex.isolation.approval import Approval, TrustedApprovers, approve_plan, public_key_text, save_private_key
from denpex.isolation.operator import OperatorConfig
from denpex.isolation.plan import IsolationPlan, Operation, utc_now
from denpex.isolation.policy import IsolationPolicy

__all__ = ["write_runbook", "KEYS", "trusted", "operator_for", "signed", "key_file", "APPROVERS_FILE"]

KEYS: dict[str, Ed25519PrivateKey] = {name: Ed25519PrivateKey.generate() for name in ("alice", "bob", "mallory")}
"""Private keys; the operator trusts alice's and bob's, never mallory's."""

_KEY_DIR = Path(tempfile.mkdtemp(prefix="denpex-keys-"))
atexit.register(shutil.rmtree, _KEY_DIR, True)
for _name, _key in KEYS.items():
    save_private_key(_key, _KEY_DIR / f"{_name}.key")
APPROVERS_FILE = _KEY_DIR / "approvers.yaml"
"""The operator's trusted approvers file (alice and bob), for `--config` settings."""
APPROVERS_FILE.write_text("approvers:\n" + "".join(
    f"  {name}: {public_key_text(KEYS[name])}\n" for name in ("alice", "bob")))


def key_file(name: str) -> str:
    """The PEM file of ``name``'s private key, for `denpex approve --key`."""
    return str(_KEY_DIR / f"{name}.key")


def trusted(names: Iterable[str] = ("alice", "bob")) -> TrustedApprovers:
    return TrustedApprovers({name: [KEYS[name].public_key()] for name in names})


def operator_for(state_dir: Path, policy: IsolationPolicy = IsolationPolicy(), *, cluster: str | None = None,
                 evidence_store: str | None = None, poll_s: float = 0.1,
                 verify_timeout_s: float = 10.0) -> OperatorConfig:
    return OperatorConfig(state_dir=state_dir, policy=policy, trusted=trusted(), cluster=cluster,
                          evidence_store=evidence_store, poll_s=poll_s, verify_timeout_s=verify_timeout_s)


def signed(plan: IsolationPlan, approver: str = "alice", *, operation: Operation = Operation.ISOLATE,
           cluster: str | None = None, at: datetime | None = None, nodes: Iterable[str] | None = None,
           key: str | None = None, comment: str = "") -> Approval:
    """A cli-signed approval by ``approver`` with ``key``'s private key (default: their own)."""
    return approve_plan(plan, approver, key=KEYS[key or approver], at=at or utc_now(), cluster=cluster,
                        operation=operation, nodes=nodes, comment=comment)


def write_runbook(path: Path, policy: IsolationPolicy) -> Path:
    """The operator's runbook file whose policy is ``policy``."""
    import yaml

    from denpex.isolation.runbook import Runbook

    runbook = Runbook(name="test-runbook", version=1, owner="tests", **dict(policy))
    assert runbook.policy() == policy
    path.write_text(yaml.safe_dump(runbook.model_dump(mode="json")))
    return path
