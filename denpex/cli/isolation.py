"""The isolation commands of the ``denpex`` CLI: approve, isolate, audit, breaker, approver.

Thin: parse options, call the core (``denpex.isolation``), render, pick the exit code.
``denpex.cli`` registers them.

Exit codes (``isolate`` uses all; the others 0 and 2):
- 0: every node of the plan is now (a dry run: would be) in the wanted state, applied or already so;
- 1: an action was sent and the node failed its post-checks;
- 2: unusable input (plan, approval, settings, runbook, a broken audit chain);
- 3: the cluster refused or could not be reached (host key, credentials, network); nodes after the
  one being acted on were not reached;
- 4: a gate blocked a node on live facts (a dry run: would block it), or the plan isolates no node
  because its gates blocked every one. Nothing failed, but not every node is isolated.
"""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from denpex.cli.exits import fail
from denpex.isolation.approval import (
    approve_plan,
    generate_key,
    load_private_key,
    public_key_text,
    save_approval,
    save_private_key,
)
from denpex.isolation.approval_file import default_approval_path, load_signed_approval
from denpex.isolation.audit import read_audit_key, verify_audit_log
from denpex.isolation.config import load_settings
from denpex.isolation.errors import IsolationError, RemoteError
from denpex.isolation.execution_text import render_execution, unfinished_summary
from denpex.isolation.operator import OperatorConfig, load_operator_config
from denpex.isolation.plan import Operation, load_plan, utc_now
from denpex.isolation.run import RunMode, execute, open_cluster

__all__ = [
    "EXIT_FAILED",
    "EXIT_REMOTE",
    "EXIT_INCOMPLETE",
    "approve_command",
    "isolate_command",
    "audit_app",
    "breaker_app",
    "approver_app",
]

EXIT_FAILED = 1
EXIT_REMOTE = 3
EXIT_INCOMPLETE = 4

audit_app = typer.Typer(no_args_is_help=True, help="Inspect the isolation audit log.")
breaker_app = typer.Typer(no_args_is_help=True, help="Show or reset the blast-radius circuit breaker.")
approver_app = typer.Typer(no_args_is_help=True, help="Approvers' proofs: ed25519 signing keys (the CLI) and "
                                                      "TOTP enrolment (the approval page).")

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", help="Isolation settings (YAML/JSON); DENPEX_* variables override."),
]


class ReportFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def approve_command(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN", help="Plan JSON from `denpex triage --plan-out`.")],
    approver: Annotated[str, typer.Option("--approver", help="Your name, as the operator's trusted approvers list it.")],
    key: Annotated[Path, typer.Option("--key", help="Your ed25519 private key (`denpex approver keygen`); "
                                                    "the approval is signed with it.")],
    out: Annotated[Path | None, typer.Option("--out", help="Approval file (default: PLAN.approval.json).")] = None,
    comment: Annotated[str, typer.Option("--comment", help="Why, for the audit trail.")] = "",
    cluster: Annotated[str | None, typer.Option(
        "--cluster", help="The cluster (Slurm ClusterName or Kubernetes context); default: the plan's. "
                          "`isolate` refuses to act on any other.")] = None,
    node: Annotated[list[str] | None, typer.Option(
        "--node", help="Approve only this node of the plan; repeatable (default: every node).")] = None,
    operation: Annotated[Operation, typer.Option(
        "--operation", help="What is approved: isolate (`isolate --execute`), rollback "
                            "(`isolate --execute --rollback`) or requeue (`isolate --execute "
                            "--requeue-hung-job`); one approval covers one operation, and at the default "
                            "path a later approval replaces the earlier one.")] = Operation.ISOLATE,
) -> None:
    """Approve one operation on one plan, by its content hash, signed with your key.

    Example:

    \b
    denpex approve plan.json --approver alice --key ~/.denpex/alice.key --cluster gpu-prod --comment "Xid 79 on gpu-node-003"
    """
    try:
        plan = load_plan(plan_path)
        approval = approve_plan(plan, approver, key=load_private_key(key), at=utc_now(), comment=comment,
                                cluster=cluster, operation=operation, nodes=node or None)
    except IsolationError as exc:
        raise fail(str(exc)) from exc
    target = out or default_approval_path(plan_path)
    save_approval(approval, target)
    typer.echo(f"approved {operation.value} of plan {approval.plan_hash[:12]} ({len(approval.nodes)} node(s)) "
               f"for incident {plan.incident_id} on cluster {approval.cluster} as {approval.approver} "
               f"(signed), until {approval.expires_at.isoformat()}: {target}")


@approver_app.command("keygen")
def approver_keygen(
    out: Annotated[Path, typer.Option("--out", help="Where to write the private key (created mode 0600).")],
    name: Annotated[str, typer.Option("--name", help="The approver's name, for the printed line.")] = "NAME",
) -> None:
    """Make an ed25519 key pair: the private key to OUT, the public key's line on stdout.

    The operator adds that line under `approvers:` in the trusted approvers file.

    Example:

    \b
    denpex approver keygen --out ~/.denpex/alice.key --name alice
    """
    key = generate_key()
    try:
        save_private_key(key, out)
    except IsolationError as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"{name}: {public_key_text(key)}")


@approver_app.command("enroll")
def approver_enroll(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The approver, as the runbook lists them.")],
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="Default: $DENPEX_STATE_DIR.")] = None,
) -> None:
    """Enroll NAME's TOTP secret for approvals on the approval page: prints the otpauth URI and a QR code.

    The secret is stored in the state directory, readable by the service user only; scan the
    code with an authenticator app (any RFC 6238 one) on the approver's phone.

    Example:

    \b
    denpex approver enroll alice
    """
    import segno

    from denpex.isolation.second_factor import TotpStore
    from denpex.state_dir import StateDirError, resolve_state_dir

    try:
        uri = TotpStore(resolve_state_dir(state_dir)).enroll(name)
    except (StateDirError, ValueError) as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"enrolled {name}; add this to an authenticator app: {uri}")
    segno.make(uri, error="m").terminal(compact=True)


def isolate_command(
    plan_path: Annotated[Path, typer.Argument(metavar="PLAN", help="Plan JSON from `denpex triage --plan-out`.")],
    dry_run: Annotated[bool, typer.Option("--dry-run/--execute",
                                          help="--dry-run (default) checks everything and changes nothing; "
                                               "--execute acts on an approved plan.")] = True,
    approval_path: Annotated[Path | None, typer.Option(
        "--approval", help="Approval file (default: PLAN.approval.json).")] = None,
    rollback: Annotated[bool, typer.Option(
        "--rollback", help="Undo the plan's actions (RESUME / uncordon) where this incident owns them.")] = False,
    requeue: Annotated[bool, typer.Option(
        "--requeue-hung-job", help="Restart the plan's hung job away from its isolated nodes (Slurm: requeue "
                                   "with ExcNodeList; Kubernetes: delete its pods there); approved on its own "
                                   "with `denpex approve --operation requeue`.")] = False,
    config: ConfigOption = None,
    output: Annotated[ReportFormat, typer.Option("--format", help="text or json.")] = ReportFormat.TEXT,
) -> None:
    """Carry out a saved plan: re-check every gate on live facts, then act, verify and audit.

    Exit status: 0 every planned node is (a dry run: would be) in the wanted state; 1 an action
    failed its post-checks; 2 unusable input; 3 the cluster refused or could not be reached;
    4 a node was (would be) blocked by a gate, or the plan isolates no node.

    Example:

    \b
    denpex isolate plan.json --execute --config settings.yaml
    """
    if rollback and requeue:
        raise fail("--rollback and --requeue-hung-job are two operations; run them one at a time")
    operation = Operation.ROLLBACK if rollback else Operation.REQUEUE if requeue else Operation.ISOLATE
    try:
        plan = load_plan(plan_path)
        settings = load_settings(config, os.environ)
        approval = None
        if not dry_run:
            approval = load_signed_approval(approval_path or default_approval_path(plan_path))
        with open_cluster(plan, settings, os.environ, missing_hint=_SETTINGS_HINT) as (operator, adapter):
            report = execute(
                plan, approval, operator=operator, adapter=adapter,
                mode=RunMode.DRY_RUN if dry_run else RunMode.EXECUTE, operation=operation,
            )
    except RemoteError as exc:
        raise fail(str(exc), EXIT_REMOTE) from exc
    except IsolationError as exc:
        raise fail(str(exc)) from exc
    if output is ReportFormat.JSON:
        typer.echo(report.model_dump_json(indent=2))
    else:
        typer.echo(render_execution(report), nl=False)
    unfinished = unfinished_summary(plan, report)
    if unfinished:
        typer.echo(f"denpex: {unfinished}", err=True)
        raise typer.Exit(EXIT_FAILED if report.failed else EXIT_INCOMPLETE)


@audit_app.command("verify")
def audit_verify(
    path: Annotated[Path, typer.Argument(metavar="FILE", help="Audit log (JSON lines).")],
    against: Annotated[Path | None, typer.Option(
        "--against", metavar="COPY",
        help="A copy of the log (e.g. from the evidence store): each of its records must be in FILE, "
             "unchanged. Catches a log cut at a record boundary, which still chains.")] = None,
    key: Annotated[Path | None, typer.Option(
        "--key", metavar="KEYFILE",
        help="The log's HMAC key (the state directory's audit.key): each record's mac must verify, "
             "which catches a log re-chained by hand.")] = None,
) -> None:
    """Check every record's hash and the chain; name each edited, removed or reordered line.

    Example:

    \b
    denpex audit verify $DENPEX_STATE_DIR/audit.jsonl --key $DENPEX_STATE_DIR/audit.key
    """
    try:
        secret = read_audit_key(key) if key else None
        verification = verify_audit_log(path, reference=against, key=secret)
    except IsolationError as exc:
        raise fail(str(exc)) from exc
    if verification.ok:
        last = verification.last
        head = (f", last seq {last.seq} at {last.time.isoformat()} (hash {last.hash[:12]})"
                if last else "")
        checked = f"; every record of {against} is in it" if against else ""
        checked += "; every mac verifies" if key else ""
        typer.echo(f"{path}: {verification.records} records, chain intact{head}{checked}")
        return
    for problem in verification.problems:
        typer.echo(f"{path}: {problem}", err=True)
    raise fail(f"{path}: audit chain broken ({len(verification.problems)} problem(s))")


@breaker_app.command("status")
def breaker_status(config: ConfigOption = None) -> None:
    """Show whether automated isolation is allowed.

    Example:

    \b
    denpex breaker status --config settings.yaml
    """
    try:
        state = _operator(config).breaker().state()
    except IsolationError as exc:
        raise fail(str(exc)) from exc
    typer.echo(json.dumps(state.model_dump(mode="json"), indent=2))


@breaker_app.command("reset")
def breaker_reset(
    by: Annotated[str, typer.Option("--by", help="The person resetting the breaker.")],
    config: ConfigOption = None,
) -> None:
    """Close a tripped breaker after a person has looked at why it tripped.

    Example:

    \b
    denpex breaker reset --by alice --config settings.yaml
    """
    try:
        state = _operator(config).breaker().reset(by=by, at=utc_now())
    except IsolationError as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"breaker reset by {state.reset_by} at {state.reset_at.isoformat() if state.reset_at else '?'}")


def _operator(config: Path | None) -> OperatorConfig:
    return load_operator_config(load_settings(config, os.environ), os.environ)


# How a CLI user provides missing connection settings.
_SETTINGS_HINT = {
    "ssh": "pass --config FILE with an `ssh:` section, or set DENPEX_SSH_HOST, DENPEX_SSH_KEY and "
           "DENPEX_SSH_KNOWN_HOSTS",
    "kubernetes": "pass --config FILE with a `kubernetes:` section, or set DENPEX_KUBECONFIG (or "
                  "DENPEX_KUBE_HOST and DENPEX_KUBE_TOKEN)",
}

