"""``denpex serve`` and ``denpex register-blocks``: the commands that run the Prefect project.

The Prefect project (``flows/``, ``tasks/``, ``blocks/``) is not part of the package: it runs from
the repository root, as Prefect projects do.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from denpex.cli.exits import fail

__all__ = ["SERVED", "register_blocks_command", "serve_command"]

SERVED = ("on-alert", "manual", "return-to-service", "requeue-hung-job", "nightly-replay")
"""The deployments ``flows.serve`` serves; a test holds the two lists together."""


def serve_command(
    only: Annotated[list[str] | None, typer.Option(
        "--only", metavar="NAME", help=f"Serve only this deployment; repeatable. One of: {', '.join(SERVED)}.")] = None,
    spawn_runs: Annotated[bool, typer.Option(
        "--spawn-runs", help="Start each run in a fresh interpreter instead of forking it from a process "
                             "that already imported the flows (seconds slower a run).")] = False,
) -> None:
    """Serve the Prefect deployments locally (triage on the alert event, manual triage, return to
    service, requeue of a hung job, nightly replay) until Ctrl-C. Run from the repository root,
    with PREFECT_API_URL set. Ignores job variables: what the API sets cannot run commands here.

    Example:

    \b
    PREFECT_API_URL=http://127.0.0.1:4200/api denpex serve --only on-alert --only manual
    """
    unknown = sorted(set(only or ()) - set(SERVED))
    if unknown:
        raise fail(f"--only {', '.join(unknown)}: no such deployment; the deployments are {', '.join(SERVED)}")
    _prefect_project()
    from flows.serve import serve as serve_deployments

    serve_deployments(set(only) if only else None, spawn_runs=spawn_runs)


def register_blocks_command(
    runbook: Annotated[str, typer.Option(
        "--runbook", metavar="NAME", help="The shipped runbook the default runbook block names.")] = "hang-triage",
    evidence_folder: Annotated[str | None, typer.Option(
        "--evidence-folder", metavar="FOLDER", help="A folder for the default evidence store block.")] = None,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="Replace the default blocks that exist.")] = False,
) -> None:
    """Register Denpex's Prefect block types and create the local default blocks. Run from the
    repository root, with PREFECT_API_URL set.

    Example:

    \b
    denpex register-blocks --evidence-folder ./incidents/demo --overwrite
    """
    _prefect_project()
    from blocks.register import register

    register(runbook=runbook, evidence_folder=evidence_folder, overwrite=overwrite)


def _prefect_project() -> None:
    """The Prefect project (flows/, tasks/, blocks/) runs from the repository root, as Prefect
    projects do; import it from the current folder, lazily, so the core never needs Prefect."""
    root = Path.cwd()
    if not (root / "flows" / "serve.py").is_file():
        raise fail(f"{root} is not the Denpex repository root (no flows/serve.py); run this from there")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
