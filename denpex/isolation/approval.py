"""Approvals: a person's consent to one operation on one plan, for named nodes on one cluster.

One record for every channel (docs/contracts.md "Approvals")::

    {"plan_hash", "operation", "incident_id", "cluster", "nodes", "approver", "comment",
     "channel": "cli-signed | approval-page | prefect-ui", "flow_run_id", "approved_at", "expires_at",
     "signature", "second_factor" ("totp" | "proxy" | null), "decision" (approval-page)}

- ``cli-signed``: ``signature`` is ed25519 over the canonical JSON of every other field, by a key
  whose public half the operator lists for that approver (``TrustedApprovers``). A name alone is
  never enough: anyone can type one.
- ``approval-page``: a person decided on Denpex's approval page for flow run ``flow_run_id``;
  ``signature`` is the page's ed25519 signature over the same canonical JSON, ``decision`` says
  approve or reject (``denpex.isolation.page_record``).
- ``prefect-ui``: a person resumed the paused flow run through Prefect's form; ``flow_run_id``
  names it. Accepted only with ``approval.second_factor: none`` (a single trusted operator), when
  the runbook lists the channel and names the approver for the tenant and cluster.

``check_approval`` judges a record against the operator's policy (never the plan's) and reports
every problem at once. A person who approved draining a node has not thereby approved resuming
it: each operation needs an approval of its own.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from denpex.evidence.loading import FileKind, read_mapping, read_model, validation_problems
from denpex.isolation.ed25519_keys import generate_key, load_private_key, public_key_text, save_private_key
from denpex.isolation.errors import ApprovalError, ConfigError
from denpex.isolation.gates import human_duration
from denpex.isolation.page_record import page_record_problems, signature_verifies
from denpex.isolation.plan import NODE_NAME_PATTERN, IsolationPlan, Operation, canonical_json
from denpex.isolation.policy import ApprovalChannel, ApprovalRule, SecondFactor

__all__ = [
    "Approval",
    "TrustedApprovers",
    "approve_plan",
    "ui_approval",
    "sign_approval",
    "check_approval",
    "save_approval",
    "load_approval",
    "generate_key",
    "public_key_text",
    "load_private_key",
    "save_private_key",
    "load_trusted_approvers",
]

_CLOCK_SKEW = timedelta(minutes=5)
MAX_APPROVAL_BYTES = 4 * 1024 * 1024
"""As large as a plan may be: an approval names at most the plan's nodes."""
MAX_APPROVERS_BYTES = 1024 * 1024
_APPROVAL_FILE = FileKind("approval", hint="approve the plan with `denpex approve PLAN --approver NAME --key KEYFILE`")
_APPROVERS_FILE = FileKind("trusted approvers", unparsable="trusted approvers are not valid YAML",
                          shape="expected a mapping with one key `approvers: {NAME: PUBLIC_KEY}`")


class Approval(BaseModel):
    """Who approved which operation on which plan's nodes, on which cluster, when and until when."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    plan_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    operation: Operation
    incident_id: str
    cluster: str = Field(min_length=1, max_length=200)
    """Node names repeat across clusters; this keeps a plan reviewed for one off another."""
    nodes: tuple[str, ...]
    """The approved nodes, a subset of the plan's; nothing else is acted on."""
    approver: str = Field(min_length=1, max_length=200)
    comment: str = Field(default="", max_length=2000)
    channel: ApprovalChannel
    flow_run_id: str | None = Field(default=None, min_length=1, max_length=200)
    approved_at: AwareDatetime
    expires_at: AwareDatetime
    signature: str | None = None
    """Base64 ed25519 signature over ``signed_bytes()``: the approver's key (``cli-signed``) or the
    approval page's (``approval-page``)."""
    second_factor: Literal["totp", "proxy"] | None = None
    """What proved the person besides reaching the service: ``totp`` when their current one-time
    code was accepted, ``proxy`` when an authenticating proxy's identity header was (``cli-signed``:
    none, the signature is the proof)."""
    decision: Literal["approve", "reject"] | None = None
    """``approval-page`` only: what the person decided. A signed ``reject`` is as binding as an
    approval: it is final for its run."""

    @model_validator(mode="after")
    def _channel_fields(self) -> Approval:
        problems = []
        for node in self.nodes:
            if not _valid_node(node):
                problems.append(f"node {node!r} is not a plain node name")
        if self.channel is ApprovalChannel.CLI_SIGNED and self.flow_run_id is not None:
            problems.append("a cli-signed approval has no flow_run_id")
        if self.channel is ApprovalChannel.PREFECT_UI and (self.flow_run_id is None or self.signature):
            problems.append("a prefect-ui approval names its flow_run_id and carries no signature")
        if (self.channel is ApprovalChannel.APPROVAL_PAGE) != (self.decision is not None) or (
                self.channel is ApprovalChannel.APPROVAL_PAGE and self.flow_run_id is None):
            problems.append("an approval-page record, and only one, names its decision and flow_run_id")
        if self.channel is ApprovalChannel.CLI_SIGNED and self.second_factor is not None:
            problems.append("a cli-signed approval's proof is its signature; it names no second_factor")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def signed_bytes(self) -> bytes:
        """What the signature covers: the canonical JSON of every field but ``signature``
        (``second_factor`` and ``decision`` are left out when unset, so that approvals signed
        before they existed verify)."""
        unsigned = {"signature"} | {name for name in ("second_factor", "decision") if getattr(self, name) is None}
        return canonical_json(self.model_dump(mode="json", exclude=unsigned)).encode()


def _valid_node(name: str) -> bool:
    return re.fullmatch(NODE_NAME_PATTERN, name) is not None


class TrustedApprovers:
    """The operator's trusted approver keys: name -> ed25519 public keys. Holds no secret."""

    def __init__(self, keys: Mapping[str, Iterable[Ed25519PublicKey]] | None = None,
                 page_keys: Iterable[Ed25519PublicKey] = ()) -> None:
        self._keys = {name: tuple(found) for name, found in (keys or {}).items()}
        self.page_keys = tuple(page_keys)
        """The approval page's public keys (the operator's configuration names the file)."""

    def keys_of(self, approver: str) -> tuple[Ed25519PublicKey, ...]:
        return self._keys.get(approver, ())

    def names(self) -> list[str]:
        return sorted(self._keys)

    def verifies(self, approval: Approval) -> bool:
        """Whether one of the approver's trusted keys made ``approval.signature``."""
        return signature_verifies(approval, self.keys_of(approval.approver))


def _draft(plan: IsolationPlan, approver: str, *, at: datetime, ttl: timedelta, cluster: str | None,
           operation: Operation, nodes: Iterable[str] | None, comment: str, channel: ApprovalChannel,
           flow_run_id: str | None = None, second_factor: Literal["totp"] | None = None) -> Approval:
    name = approver.strip()
    if not name:
        raise ApprovalError("an approval needs the approver's name (--approver NAME)")
    where = (cluster or "").strip() or plan.cluster
    if not where:
        raise ApprovalError("name the cluster this approval is for (--cluster NAME); the plan does not "
                            "record one, and an approval valid on every cluster is not accepted")
    if plan.cluster is not None and where != plan.cluster:
        raise ApprovalError(f"the plan was made for cluster {plan.cluster!r}, not {where!r}")
    planned = [a.node for a in plan.actions]
    chosen = tuple(sorted(set(planned if nodes is None else nodes)))
    extra = sorted(set(chosen) - set(planned))
    if extra:
        raise ApprovalError(f"{', '.join(extra)} not in the plan; approve only nodes it names "
                            f"({', '.join(planned) or 'none'})")
    try:
        return Approval(
            plan_hash=plan.content_hash(), operation=operation, incident_id=plan.incident_id,
            cluster=where, nodes=chosen, approver=name, comment=comment, channel=channel,
            flow_run_id=flow_run_id, approved_at=at, expires_at=at + ttl, second_factor=second_factor,
        )
    except ValidationError as exc:
        raise ApprovalError(f"invalid approval: {validation_problems(exc)}") from exc


def approve_plan(plan: IsolationPlan, approver: str, *, key: Ed25519PrivateKey, at: datetime,
                 comment: str = "", cluster: str | None = None,
                 operation: Operation = Operation.ISOLATE, nodes: Iterable[str] | None = None,
                 ttl: timedelta | None = None) -> Approval:
    """A ``cli-signed`` approval of ``operation`` on ``plan`` (all its nodes unless ``nodes``), on
    ``cluster`` (default: the plan's), signed with ``approver``'s private ``key``.

    ``ttl`` defaults to the plan's policy TTL; execution refuses any approval that lasts longer
    than the operator's.
    """
    draft = _draft(plan, approver, at=at, ttl=ttl or plan.policy.approval.ttl, cluster=cluster,
                   operation=operation, nodes=nodes, comment=comment, channel=ApprovalChannel.CLI_SIGNED)
    return sign_approval(draft, key)


def ui_approval(plan: IsolationPlan, approver: str, *, flow_run_id: str, at: datetime, ttl: timedelta,
                cluster: str | None = None, operation: Operation = Operation.ISOLATE,
                nodes: Iterable[str] | None = None, comment: str = "",
                second_factor: Literal["totp"] | None = None) -> Approval:
    """A ``prefect-ui`` approval: ``approver`` resumed flow run ``flow_run_id``. ``ttl`` comes from
    the operator's runbook (the flow passes ``policy.approval.ttl``); ``second_factor`` is
    ``"totp"`` once the flow accepted the approver's current code (``denpex.workflow.approval_answer``)."""
    return _draft(plan, approver, at=at, ttl=ttl, cluster=cluster, operation=operation, nodes=nodes,
                  comment=comment, channel=ApprovalChannel.PREFECT_UI, flow_run_id=flow_run_id,
                  second_factor=second_factor)


def sign_approval(approval: Approval, key: Ed25519PrivateKey) -> Approval:
    """The approval with its ed25519 signature (cli-signed)."""
    unsigned = approval.model_copy(update={"signature": None})
    signature = base64.b64encode(key.sign(unsigned.signed_bytes())).decode()
    return unsigned.model_copy(update={"signature": signature})


def check_approval(plan: IsolationPlan, approval: Approval | None, *, now: datetime, operation: Operation,
                   rule: ApprovalRule, trusted: TrustedApprovers, cluster: str | None,
                   tenant: str | None = None) -> Approval:
    """Return ``approval`` when it authenticates and lets ``operation`` run on ``plan`` on
    ``cluster`` (the one the settings reach) now; else one ApprovalError listing every problem.

    ``rule`` is the operator's approval rule, never the plan's. ``tenant`` is the owner of
    ``cluster`` in the operator's registry (``denpex.tenancy.execution_tenant``), never the plan's
    field, which whoever can write the plan file can null or change; None: the cluster has no
    registered owner and no tenant scoping applies. The plan's age is judged only to isolate:
    undoing an old isolation must stay possible.
    """
    digest = plan.content_hash()
    if approval is None:
        raise ApprovalError(
            f"plan {digest[:12]} for incident {plan.incident_id} has no approval; a person approves "
            "it with `denpex approve PLAN --approver NAME --key KEYFILE`"
        )
    problems = _authenticity(approval, rule, trusted, tenant)
    problems += _binding(plan, approval, digest, operation, cluster)
    if approval.expires_at <= now:
        problems.append(f"the approval by {approval.approver} expired at {approval.expires_at.isoformat()}")
    if approval.expires_at - approval.approved_at > rule.ttl + _CLOCK_SKEW:
        problems.append(f"the approval lasts longer than the runbook's {human_duration(rule.ttl)}")
    if approval.approved_at > now + _CLOCK_SKEW:
        problems.append(f"the approval is dated in the future ({approval.approved_at.isoformat()})")
    if operation is Operation.ISOLATE and now - plan.as_of > rule.max_plan_age:
        problems.append(f"the plan's evidence is as of {plan.as_of.isoformat()}, more than "
                        f"{human_duration(rule.max_plan_age)} ago; triage again before acting")
    if problems:
        raise ApprovalError("execution refused: " + "; ".join(problems))
    return approval


def _authenticity(approval: Approval, rule: ApprovalRule, trusted: TrustedApprovers,
                  tenant: str | None) -> list[str]:
    allowed = rule.approvers_for(tenant, approval.cluster)
    who = approval.approver
    if approval.channel not in rule.channels:
        accepted = ", ".join(sorted(c.value for c in rule.channels))
        return [f"the runbook does not accept {approval.channel.value} approvals (accepted: {accepted})"]
    problems = []
    if approval.channel is ApprovalChannel.CLI_SIGNED:
        if not trusted.keys_of(who):
            problems.append(f"no trusted key is configured for {who!r}; the operator adds their public "
                            "key to the trusted approvers file")
        elif not trusted.verifies(approval):
            problems.append(f"the signature does not verify with {who!r}'s trusted key (forged, edited "
                            "after signing, or signed with another key)")
    elif approval.channel is ApprovalChannel.APPROVAL_PAGE:
        problems += page_record_problems(approval, rule, trusted.page_keys, allowed)
    else:
        problems += _ui_proof(approval, rule, allowed)
    if allowed and who not in allowed:
        problems.append(f"{who!r} is not an allowed approver here ({', '.join(sorted(allowed))})")
    elif not allowed and who in _scoped_names(rule):
        # An approver the runbook scopes to some tenants or clusters approves only there, whatever
        # the registry holds: with nobody listed here, any trusted key would otherwise do, theirs too.
        problems.append(f"{who!r} approves only where the runbook scopes them, not for tenant {tenant or '(none)'!r} "
                        f"on cluster {approval.cluster!r}")
    elif not allowed and tenant is None and any(scope.tenant != "*" for scope in rule.scoped):
        # Fail closed: the runbook scopes approvers by tenant, and without a registered owner nobody
        # can tell whose approvers apply here; "anyone with a trusted key" is not the answer.
        problems.append(f"the runbook scopes approvers by tenant, and cluster {approval.cluster!r} has no registered "
                        "owner in the operator's registry, so whose approvers apply cannot be told; register it "
                        f"(`denpex clusters add {approval.cluster} --tenant TENANT`) or list approvers for every tenant")
    return problems


def _ui_proof(approval: Approval, rule: ApprovalRule, allowed: frozenset[str]) -> list[str]:
    """What a prefect-ui record needs besides its approver's name: a runbook list that names
    somebody, and the second factor the runbook asks for."""
    problems = []
    if not allowed:
        problems.append("the runbook names no approvers for this tenant and cluster, so a prefect-ui "
                        "approval cannot be accepted")
    if rule.second_factor is not SecondFactor.NONE:
        problems.append(f"the runbook proves approvers on the approval page (approval.second_factor: "
                        f"{rule.second_factor.value}); a Prefect form answer is accepted only with second_factor: none")
    return problems


def _scoped_names(rule: ApprovalRule) -> frozenset[str]:
    return frozenset(name for scope in rule.scoped for name in scope.names)


def _binding(plan: IsolationPlan, approval: Approval, digest: str, operation: Operation,
             cluster: str | None) -> list[str]:
    problems = []
    if approval.operation is not operation:
        problems.append(f"the approval by {approval.approver} is for {approval.operation.value}, not "
                        f"{operation.value}; a person approves the {operation.value} with "
                        f"`denpex approve PLAN --approver NAME --key KEYFILE --operation {operation.value}`")
    if approval.plan_hash != digest:
        problems.append(f"the approval is for plan {approval.plan_hash[:12]}, not {digest[:12]} "
                        "(the plan changed after approval); approve the current plan")
    if approval.incident_id != plan.incident_id:
        problems.append(f"the approval is for incident {approval.incident_id}, not {plan.incident_id}")
    if plan.cluster is not None and approval.cluster != plan.cluster:
        problems.append(f"the approval is for cluster {approval.cluster!r}, the plan for {plan.cluster!r}")
    if approval.cluster != cluster:
        reached = repr(cluster) if cluster else "one that does not say its name (set `cluster:` in the settings)"
        problems.append(f"{approval.approver} approved this plan for cluster {approval.cluster!r}, but the "
                        f"settings reach cluster {reached}")
    extra = sorted(set(approval.nodes) - {a.node for a in plan.actions})
    if extra:
        problems.append(f"the approval names {', '.join(extra)}, which the plan does not")
    return problems


def save_approval(approval: Approval, path: Path) -> None:
    path.write_text(approval.model_dump_json(indent=2) + "\n", encoding="utf-8")


def load_approval(path: Path) -> Approval:
    """Read an approval file written by ``denpex approve``; every problem in one ApprovalError."""
    return read_model(path, Approval, max_bytes=MAX_APPROVAL_BYTES, kind=_APPROVAL_FILE, error=ApprovalError)


# -- keys (the files themselves: denpex.isolation.ed25519_keys) ----------------------------


def load_trusted_approvers(path: Path) -> TrustedApprovers:
    """Read the operator's trusted approvers file (YAML)::

        approvers:
          alice: MCowBQYDK2VwAyEA...   # or a list of keys
          bob: [key1, key2]

    Every problem is reported in one ConfigError.
    """
    raw = read_mapping(path, max_bytes=MAX_APPROVERS_BYTES, kind=_APPROVERS_FILE, error=ConfigError, syntax="yaml",
                       empty_ok=True)
    entries = raw.get("approvers") if isinstance(raw, dict) and set(raw) == {"approvers"} else None
    if not isinstance(entries, dict):
        raise ConfigError(f"{path}: expected a mapping with one key `approvers: {{NAME: PUBLIC_KEY}}`")
    keys: dict[str, list[Ed25519PublicKey]] = {}
    problems = []
    for name, value in entries.items():
        for text in value if isinstance(value, list) else [value]:
            try:
                key = Ed25519PublicKey.from_public_bytes(base64.b64decode(str(text), validate=True))
            except (binascii.Error, ValueError):
                problems.append(f"{name}: {str(text)[:20]!r} is not a base64 ed25519 public key")
                continue
            keys.setdefault(str(name), []).append(key)
    if problems:
        raise ConfigError(f"{path}: " + "; ".join(problems))
    return TrustedApprovers(keys)
