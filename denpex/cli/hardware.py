"""``denpex collect-telemetry``: the thin command over ``denpex.hardware.nvml_collector.collect_telemetry``.

Exit status 0 when the collection ran (whatever it found, including "not available" signals), 2
when NVML cannot be used on this host or the output cannot be written, with one line on stderr.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer

from denpex.cli.exits import fail
from denpex.hardware.errors import CollectorError
from denpex.hardware.nvml_collector import collect_telemetry, load_pynvml

__all__ = ["collect_telemetry_command"]

EXIT_CANNOT_COLLECT = 2


def collect_telemetry_command(
    out: Annotated[Path, typer.Option("--out", help="JSON-lines file to write (replaced if it exists).")],
    duration_s: Annotated[float, typer.Option("--duration-s", min=0, help="Seconds to listen for Xid events.")] = 30.0,
    host: Annotated[str | None, typer.Option("--host", help="Host name to record (default: this host's name).")] = None,
) -> None:
    """On a GPU host: snapshot NVLink counters and remapped rows, listen for Xid events, snapshot again.

    Example:

    \b
    denpex collect-telemetry --out /var/tmp/telemetry.jsonl --duration-s 30
    """
    name = host or socket.gethostname()
    try:
        nvml = load_pynvml()
        with out.open("w", encoding="utf-8") as handle:
            summary = collect_telemetry(handle, duration_s=duration_s, host=name, nvml=nvml)
    except CollectorError as exc:
        raise fail(str(exc), EXIT_CANNOT_COLLECT) from exc
    except OSError as exc:
        raise fail(f"{out}: cannot write telemetry: {exc.strerror or exc}", EXIT_CANNOT_COLLECT) from exc
    typer.echo(
        f"{out}: {summary.records} records from {name}: {summary.gpus} GPUs, {summary.xid_events} Xid events, "
        f"{summary.unavailable} signals not available"
    )
