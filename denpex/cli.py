"""The ``denpex`` command line: parse, call the core, render, pick the exit code.

Exit status 0 whenever triage ran, whatever the verdict; 2 for unusable input, with one clear line
on stderr (docs/contracts.md).
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from denpex.approval_page.command import serve_approvals_command
from denpex.collector.node_agent_command import node_agent_command
from denpex.evidence.errors import EvidenceError
from denpex.hardware import HardwareError
from denpex.hardware.collect_command import collect_telemetry_command
from denpex.ingest.commands import clusters_app, keys_app, serve_api_command, tenants_app, tokens_app
from denpex.investigate import investigate
from denpex.isolation.commands import approve_command, approver_app, audit_app, breaker_app, isolate_command
from denpex.isolation.errors import IsolationError
from denpex.isolation.plan import save_plan
from denpex.isolation.policy import Scheduler
from denpex.report import render_text
from denpex.terminal_progress import dump_progress

__all__ = ["app", "main"]

# Plain help (rich_markup_mode=None): typer's rich panels tag every flag, even --help, as <bool>.
app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Find the ranks behind a distributed-training hang.")

EXIT_UNUSABLE = 2


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def fail(message: str) -> typer.Exit:
    """Print one line on stderr and return the exit for unusable input."""
    typer.echo(f"denpex: error: {message}", err=True)
    return typer.Exit(EXIT_UNUSABLE)


def parse_time(value: str | None) -> datetime | None:
    """An ISO time; a time without zone is UTC."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise fail(f"--as-of {value!r} is not an ISO time such as 2026-11-29T18:45:02Z") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


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


@app.command()
def triage(
    path: Annotated[str, typer.Argument(metavar="PATH", help="Folder of per-rank FR dumps, or s3://bucket/prefix.")],
    world_size: Annotated[int | None, typer.Option("--world-size", min=1, help="Number of ranks in the job.")] = None,
    manifest: Annotated[Path | None, typer.Option("--manifest", help="Job manifest JSON (default: PATH/manifest.json).")] = None,
    as_of: Annotated[str | None, typer.Option("--as-of", help="Incident time (ISO); default: newest time in the evidence.")] = None,
    output: Annotated[OutputFormat, typer.Option("--format", help="text for people, json for machines.")] = OutputFormat.TEXT,
    scheduler: Annotated[Scheduler | None, typer.Option("--scheduler", help="Plan an isolation for this scheduler.")] = None,
    incident_id: Annotated[str | None, typer.Option("--incident-id", help="Incident id for the plan (default: from the evidence time); 1-63 of A-Za-z0-9._-, starting and ending with a letter or digit.")] = None,
    runbook: Annotated[Path | None, typer.Option("--runbook", help="Runbook YAML (default: built-in safe policy); `denpex isolate` refuses a plan made under another policy than the operator's.")] = None,
    host_domain: Annotated[str | None, typer.Option("--host-domain", metavar="DOMAIN", help="Your hosts' DNS domain: NAME.DOMAIN and NAME are one host. Other names match exactly, so a host of another domain never lends a node its signals.")] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="The cluster the plan is for (Slurm ClusterName or Kubernetes context); approvals and execution are bound to it.")] = None,
    plan_out: Annotated[Path | None, typer.Option("--plan-out", help="Write the full isolation plan JSON here (for `denpex isolate`).")] = None,
    telemetry: Annotated[list[Path] | None, typer.Option("--telemetry", metavar="FILE", help="Kernel log (journalctl -k -o short-iso) or collect-telemetry output; repeatable.")] = None,
    chart: Annotated[Path | None, typer.Option("--chart", metavar="PNG", help="Write the job overview PNG here, and one PNG per stuck group beside it (NAME.group-*.png).")] = None,
) -> None:
    """Compare every rank's Flight Recorder dump and name the ranks behind the hang.

    Exit status: 0 triage ran, whatever the verdict; 2 unusable input (one line on stderr).

    Example:

    \b
    denpex triage ./dumps --world-size 8 --telemetry kern.log --scheduler slurm --cluster gpu-prod --plan-out plan.json
    """
    if chart is not None:
        _make_folder_for(chart)
    if scheduler is not None and plan_out is not None and not (cluster or "").strip():
        # Triage runs offline and cannot ask the cluster its name; a plan file is for execution,
        # which is bound to one cluster, so the operator names it rather than each approver later.
        raise fail("--plan-out needs --cluster NAME (the Slurm ClusterName or Kubernetes context the plan "
                   "is for): approvals and execution are bound to the plan's cluster")
    try:
        with dump_progress(sys.stderr) as progress:
            found = investigate(path, world_size=world_size, manifest=manifest, as_of=parse_time(as_of),
                                telemetry=telemetry or (), scheduler=scheduler,
                                incident_id=incident_id, runbook=runbook, progress=progress,
                                cluster=cluster, host_domain=host_domain,
                                keep_progress=chart is not None)
    except (EvidenceError, HardwareError, IsolationError, ValueError) as exc:
        raise fail(str(exc)) from exc
    if plan_out is not None and found.plan is not None:
        save_plan(found.plan, plan_out)
    if chart is not None and found.progress is not None:
        from denpex.charts.files import write_charts  # matplotlib loads only when a chart is asked for
        try:
            for written in write_charts(found.report, found.progress, chart):
                typer.echo(f"chart: {written}", err=True)
        except OSError as exc:
            raise fail(f"--chart {chart}: {exc.strerror or exc}") from exc
    if output is OutputFormat.JSON:
        typer.echo(found.report.model_dump_json(indent=2))
    else:
        typer.echo(render_text(found.report), nl=False)


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


def _prefect_project() -> None:
    """The Prefect project (flows/, tasks/, blocks/) runs from the repository root, as Prefect
    projects do; import it from the current folder, lazily, so the core never needs Prefect."""
    root = Path.cwd()
    if not (root / "flows" / "serve.py").is_file():
        raise fail(f"{root} is not the Denpex repository root (no flows/serve.py); run this from there")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))


def _make_folder_for(path: Path) -> None:
    """Create the folder a written file goes in, or refuse with one line before any work."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(f"cannot create the folder {path.parent} for {path.name}: {exc.strerror or exc}") from exc


SERVED = ("on-alert", "manual", "return-to-service", "requeue-hung-job", "nightly-replay")


@app.command()
def serve(
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


@app.command("register-blocks")
def register_blocks(
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


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: usage errors are one ``denpex: error:`` line, as every other error."""
    from denpex.cli_help import run_tidy

    run_tidy(app, argv, prog_name="denpex", exit_unusable=EXIT_UNUSABLE)
