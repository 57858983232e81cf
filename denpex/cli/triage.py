"""``denpex triage``: compare every rank's Flight Recorder dump and name the ranks behind the hang.

Exit status 0 whenever triage ran, whatever the verdict; 2 for unusable input, with one clear line
on stderr (docs/contracts.md). The work is ``denpex.investigate.investigate``'s; this parses the
options, renders the report and picks the status.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from denpex.cli.exits import fail
from denpex.evidence.errors import EvidenceError
from denpex.hardware import HardwareError
from denpex.investigate import investigate
from denpex.isolation.errors import IsolationError
from denpex.isolation.plan import save_plan
from denpex.isolation.policy import Scheduler
from denpex.report import render_text
from denpex.terminal_progress import dump_progress

__all__ = ["OutputFormat", "parse_time", "triage_command"]


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def parse_time(value: str | None) -> datetime | None:
    """An ISO time; a time without zone is UTC."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise fail(f"--as-of {value!r} is not an ISO time such as 2026-11-29T18:45:02Z") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def triage_command(
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


def _make_folder_for(path: Path) -> None:
    """Create the folder a written file goes in, or refuse with one line before any work."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(f"cannot create the folder {path.parent} for {path.name}: {exc.strerror or exc}") from exc
