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


@app.callback()
def _root() -> None:
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
    """Compare every rank's Flight Recorder dump and name the ranks behind the hang."""
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
        for written in write_charts(found.report, found.progress, chart):
            typer.echo(f"chart: {written}", err=True)
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


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(ctx: typer.Context) -> None:
    """Serve the Prefect deployments locally (triage on the alert event, manual triage, return to
    service, nightly replay); options: --only NAME."""
    _prefect_project()
    from flows.serve import main as serve_main

    serve_main(list(ctx.args))


@app.command("register-blocks", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def register_blocks(ctx: typer.Context) -> None:
    """Register Denpex's Prefect block types and the local defaults (--evidence-folder, --overwrite)."""
    _prefect_project()
    from blocks.register import main as register_main

    register_main(list(ctx.args))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    app(args=argv, prog_name="denpex")
