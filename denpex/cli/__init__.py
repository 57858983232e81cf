"""The ``denpex`` command line: parse, call the core, render, pick the exit code.

The only package of ``denpex`` that imports typer (the import contract in pyproject.toml holds it
to that). One module per group of commands, each over the package whose work it fronts:

    triage          ``triage`` (denpex.investigate)
    hardware        ``collect-telemetry``
    collector       ``node-agent``
    isolation       ``approve``, ``isolate``, ``audit``, ``breaker``, ``approver``
    ingest          ``tenants``, ``clusters``, ``keys``, ``tokens``, ``serve-api``
    approval_page   ``serve-approvals``
    project         ``serve``, ``register-blocks`` (the Prefect project in the repository root)
    help            how the help and the usage errors are shown
    exits           the one ``denpex: error:`` line and the exit statuses

Exit status 0 whenever triage ran, whatever the verdict; 2 for unusable input, with one clear line
on stderr (docs/contracts.md).
"""

from __future__ import annotations

from typing import Annotated

import typer

from denpex.cli.approval_page import serve_approvals_command
from denpex.cli.collector import node_agent_command
from denpex.cli.exits import EXIT_UNUSABLE
from denpex.cli.hardware import collect_telemetry_command
from denpex.cli.ingest import clusters_app, keys_app, serve_api_command, tenants_app, tokens_app
from denpex.cli.isolation import approve_command, approver_app, audit_app, breaker_app, isolate_command
from denpex.cli.project import register_blocks_command, serve_command
from denpex.cli.triage import triage_command

__all__ = ["app", "main"]

# Plain help (rich_markup_mode=None): typer's rich panels tag every flag, even --help, as <bool>.
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Find the ranks behind a distributed-training hang.")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"denpex {_version()}")
        raise typer.Exit()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("denpex")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


@app.callback()
def _root(
    _show_version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                                help="Print the version and exit.")] = False,
) -> None:
    """Denpex: distributed-training hang triage."""


# `denpex --help` lists the commands in the order they are added here.
app.command("triage")(triage_command)
app.command("collect-telemetry")(collect_telemetry_command)
app.command("node-agent")(node_agent_command)
app.command("approve")(approve_command)
app.command("isolate")(isolate_command)
app.add_typer(audit_app, name="audit")
app.add_typer(breaker_app, name="breaker")
app.add_typer(tenants_app, name="tenants")
app.add_typer(clusters_app, name="clusters")
app.command("serve-api")(serve_api_command)
app.command("serve-approvals")(serve_approvals_command)
app.add_typer(keys_app, name="keys")
app.add_typer(tokens_app, name="tokens")
app.add_typer(approver_app, name="approver")
app.command("serve")(serve_command)
app.command("register-blocks")(register_blocks_command)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: usage errors are one ``denpex: error:`` line, as every other error."""
    from denpex.cli.help import run_tidy

    run_tidy(app, argv, prog_name="denpex", exit_unusable=EXIT_UNUSABLE)
