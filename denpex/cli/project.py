"""``denpex serve`` and ``denpex register-blocks``: the commands that run the Prefect project.

The Prefect project (``flows/``, ``tasks/``, ``blocks/``) is not part of the package: it runs from
the repository root, as Prefect projects do, and the core never imports it (nor Prefect). These
commands check their options and that the current folder is that root, then hand over to the
project's own entry point with ``python -m`` (``flows.serve``, ``blocks.register``), which finds
the project from the root as ``python -m`` does: nothing is added to this process's ``sys.path``.

The hand-over replaces this process (``exec``) rather than starting a child: the served runner
keeps this process's id, its Ctrl-C and SIGTERM reach the runner itself (which stops at once, see
``flows/serve.py``), and its exit status is the command's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn

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
    # flows.serve.main takes the same options (argparse); NAME=VALUE keeps a value that starts
    # with a dash a value.
    _run_project_module("flows.serve", [*(f"--only={name}" for name in only or ()),
                                        *(["--spawn-runs"] if spawn_runs else [])])


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
    _run_project_module("blocks.register", [f"--runbook={runbook}",
                                            *([f"--evidence-folder={evidence_folder}"] if evidence_folder is not None else []),
                                            *(["--overwrite"] if overwrite else [])])


def _run_project_module(module: str, args: list[str]) -> NoReturn:
    """Become ``python -m MODULE ARGS`` in the repository root, with this interpreter."""
    root = Path.cwd()
    if not (root / "flows" / "serve.py").is_file():
        raise fail(f"{root} is not the Denpex repository root (no flows/serve.py); run this from there")
    # python -m puts the current folder first on the module's sys.path, unless told not to
    # (PYTHONSAFEPATH); the project is imported from there, as it was from this process before.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONSAFEPATH"}
    sys.stdout.flush()  # exec discards what Python has buffered but not written
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, "-m", module, *args], env)
    except OSError as exc:  # returns only when the interpreter could not be started at all
        raise fail(f"cannot start {sys.executable} -m {module}: {exc.strerror or exc}") from exc
