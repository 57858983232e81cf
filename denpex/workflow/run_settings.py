"""A run's settings are its worker's, never what the Prefect API gave the run.

The evidence roots, the state directory, the runbooks, the S3 endpoint, credentials and CA
bundle, proxies and the SSH and Kubernetes targets reach a flow through its worker's environment.
A process worker starts each run with ``{**its environment, **the job configuration's env}``, and
that env is rendered from job variables (the flow run's, its deployment's, its work pool's base
job template, dot keys such as ``env.X`` and template variables included): all editable by anyone
who reaches the Prefect API. A run given ``DENPEX_EVIDENCE_ROOT`` there passed the evidence binding
with a forged folder; one given ``HTTPS_PROXY`` read the real folder through a forger (attacker
reviews). A deny-list of names is never complete, so the rule is: the job configuration adds no
environment variable at all, replaces no command, and the deployment's pull steps only set the
working directory (a pull step can update ``os.environ`` before the flow starts), and only to the
folder that holds the running ``flows`` package (a working directory elsewhere would load another
folder's code, runbooks or ``prefect.yaml`` as this deployment's).

A worker's run does more than read settings: the command that starts it comes from the same job
configuration, and is replaced through the API before the flow can check anything. Whoever may
write through the API thus runs commands as the worker's user. Such a worker must not be able to
read the approval page's secrets (the approvers' TOTP secrets, the page's signing key) or replace
the public key the flow trusts, or those writers approve as anyone: a run that ``denpex serve``
did not start refuses to go on where it can (:func:`check_approval_secrets`). ``denpex serve``
runs its flows itself and ignores job variables and pull steps, so its runs may share a state
directory with the page.

This module is the rule, on plain data; ``flows/run_settings.py`` renders the job configuration
the way Prefect's worker does and reads the deployment from the API. (``denpex serve`` ignores
job variables; the check holds there too.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from denpex.isolation.cluster_secrets import cluster_secrets_dir, worker_secret_files
from denpex.isolation.errors import ConfigError
from denpex.isolation.page_record import page_public_key_path, signing_key_path
from denpex.isolation.second_factor import TotpStore
from denpex.workflow.flow_parameters import FlowParameterError

__all__ = ["ALLOWED_PULL_STEPS", "SERVED_MARKER", "check_run_settings", "approval_secrets", "approval_trust_anchors",
           "check_approval_secrets"]

ALLOWED_PULL_STEPS = frozenset({"prefect.deployments.steps.set_working_directory"})
"""The only pull step a deployment may have (prefect.yaml's: run from the repository's folder)."""


def check_run_settings(*, env: Mapping[str, Any] | None, command: str | None,
                       pull_steps: Sequence[Any] | None, code_root: Path) -> None:
    """FlowParameterError naming what the job configuration or the deployment sets that only the
    worker may: environment variables (by name, never by value), a command, a pull step, a
    working directory other than ``code_root`` (the folder that holds the running ``flows``)."""
    problems = []
    if env:
        names = ", ".join(sorted(str(name) for name in env))
        problems.append(f"the job configuration sets environment variable(s) {names}")
    if command:
        problems.append("the job configuration replaces the command that starts the run")
    # Every key of each step: Prefect runs a step's last key (step.popitem()), not its first.
    steps = [str(key) for step in pull_steps or () for key in (step if isinstance(step, Mapping) and step else ("?",))]
    others = sorted({step for step in steps if step not in ALLOWED_PULL_STEPS})
    if others:
        problems.append(f"the deployment's pull steps include {', '.join(others)}")
    problems += _working_directories(pull_steps or (), code_root)
    if problems:
        raise FlowParameterError(
            "this run's settings must be its worker's: " + "; ".join(problems) + " (the evidence roots, "
            "state, runbooks, S3, proxies and cluster access come from the worker's own environment, "
            "never from job variables or pull steps, which the Prefect API can edit); nothing was done")


def _working_directories(pull_steps: Sequence[Any], code_root: Path) -> list[str]:
    """Each ``set_working_directory`` step must name ``code_root`` itself (symlinks resolved)."""
    root = os.path.realpath(code_root)
    problems = []
    for step in pull_steps:
        if not isinstance(step, Mapping):
            continue
        for key, options in step.items():
            if key not in ALLOWED_PULL_STEPS:
                continue
            directory = options.get("directory") if isinstance(options, Mapping) else None
            if not isinstance(directory, str) or os.path.realpath(directory) != root:
                problems.append(f"the deployment's set_working_directory names {str(directory)[:200]!r}, not the "
                                f"folder that holds the running flows package ({root})")
    return problems


SERVED_MARKER = "DENPEX_SERVED_RUNS"
"""Set by ``denpex serve`` in its own environment, which its runs inherit. A worker's run never
has it: the job configuration that would set it is refused (:func:`check_run_settings`), and an
API writer who sets it anyway has gained nothing, their command having run already."""


def approval_secrets(state_dir: Path) -> list[Path]:
    """Where the approval page keeps its secrets in ``state_dir``: each approver's TOTP secret (or
    their folder, when it can be entered but not listed) and the page's signing key (when it was
    given no secret file of its own)."""
    totp = TotpStore(state_dir).folder
    try:
        secrets = sorted(p for p in totp.iterdir() if p.is_file())
    except OSError:  # no folder, or one this user cannot list
        secrets = [totp] if totp.is_dir() and os.access(totp, os.X_OK) else []
    return [*secrets, signing_key_path(state_dir)]


def approval_trust_anchors(environ: Mapping[str, str], state_dir: Path) -> list[Path]:
    """What the flow trusts a page decision by: the page's public key file and its folder. Whoever
    can replace the file signs decisions of their own."""
    key = page_public_key_path(environ, state_dir)
    return [key, key.parent]


def _cluster_credentials(environ: Mapping[str, str]) -> list[Path]:
    """The clusters' SSH keys and tokens the worker keeps (``denpex.isolation.cluster_secrets``):
    a command an API writer chose would read them as well."""
    try:
        return worker_secret_files(cluster_secrets_dir(environ))
    except ConfigError:  # a relative folder: the run refuses it when it reaches its target
        return []


def _readable(path: Path) -> bool:
    return (path.is_file() and os.access(path, os.R_OK)) or (path.is_dir() and os.access(path, os.X_OK))


def _writable(path: Path) -> bool:
    return path.exists() and os.access(path, os.W_OK)


def check_approval_secrets(*, served: bool, work_pool: str | None, state_dir: Path,
                           environ: Mapping[str, str], readable: Callable[[Path], bool] = _readable,
                           writable: Callable[[Path], bool] = _writable) -> None:
    """FlowParameterError when this run was not started by ``denpex serve`` (``served``) and its
    process can read an approval secret in ``state_dir`` or replace the public key the flow trusts.
    A worker starts a run with the command its job configuration names, which the Prefect API edits:
    an API writer could have read the secrets, or planted a key, and approved as anyone.

    A tripwire, not a barrier: that command has run before this check, and need not start the flow
    at all. It makes a worker set up where page approvals cannot hold fail loudly, on its first run."""
    if served:
        return
    found = [str(p) for p in approval_secrets(state_dir) + _cluster_credentials(environ) if readable(p)]
    found += [f"{p} (writable)" for p in approval_trust_anchors(environ, state_dir) if writable(p)]
    if found:
        by = f"work pool {work_pool[:100]!r}'s worker" if work_pool else "a process other than `denpex serve`"
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise FlowParameterError(
            f"this run was started by {by}, which can reach the approval page's secrets or its key, or the "
            f"clusters' credentials ({shown}): "
            "a worker runs the command its job configuration names, which anyone who may write through the "
            "Prefect API can replace, so they could approve as any approver. Run the flows with `denpex serve` "
            "(it ignores job variables), or as a user that can neither read the approvers' TOTP secrets and "
            "the page's signing key nor write its public key; nothing was done")
