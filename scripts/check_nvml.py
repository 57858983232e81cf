#!/usr/bin/env python3
"""Check the NVML collector on a real GPU host and print what it read.

    .venv/bin/python scripts/check_nvml.py [--duration-s 5] [--out FILE]

Runs ``denpex collect-telemetry``'s collector with the real ``pynvml`` for a few seconds, then reads
the output back with the telemetry parser and prints: the GPUs (UUID, PCI bus id, PCIe bridges),
the NVLink links and counters, remapped rows, Xid events, and every signal that was "not
available". Exit status 0 when NVML ran, 2 when it could not initialise (the reason is printed).
Paste the output into the issue note whenever a real GPU is at hand.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
from collections import Counter
from pathlib import Path

from denpex.hardware import NvmlUnavailableError, load_telemetry
from denpex.hardware.nvml_collector import collect_telemetry, load_pynvml


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=5.0, help="seconds to listen for Xid events")
    parser.add_argument("--out", type=Path, default=None, help="keep the JSON lines here (default: a temp file)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="denpex-nvml-")) / "telemetry.jsonl"
    host = socket.gethostname()
    try:
        nvml = load_pynvml()
        with out.open("w", encoding="utf-8") as handle:
            summary = collect_telemetry(handle, duration_s=args.duration_s, host=host, nvml=nvml)
    except NvmlUnavailableError as exc:
        print(f"NVML unavailable: {exc}")
        return 2
    print(f"collector: {summary.model_dump()} -> {out}")

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    session: dict[str, object] = next((r for r in lines if r["type"] == "session"), {})
    print(f"host {host}, driver {session.get('driver_version', 'unknown')}")
    parsed = load_telemetry([out])
    for gpu in parsed.gpus:
        print(f"GPU {gpu.gpu.index}: {gpu.name} uuid={gpu.gpu.uuid} pci={gpu.gpu.pci_bus_id} pcie_path={gpu.pcie_path}")
    links = [r for r in lines if r["type"] == "nvlink"]
    per_gpu = Counter((r["gpu"].get("pci_bus_id"), r["snapshot"], r["active"]) for r in links)
    for (pci, snapshot, active), count in sorted(per_gpu.items(), key=str):
        print(f"NVLink {pci} snapshot {snapshot}: {count} links {'active' if active else 'inactive'}")
    for record in links[:4]:
        print(f"  e.g. link {record['link']} counters {record.get('counters')}")
    for record in (r for r in lines if r["type"] == "remapped_rows"):
        print(f"remapped rows {record['gpu'].get('pci_bus_id')} snapshot {record['snapshot']}: "
              f"correctable={record['correctable']} uncorrectable={record['uncorrectable']} "
              f"pending={record['pending']} failure={record['failure']}")
    for event in parsed.events:
        print(f"event: {event.kind.value} code={event.code} severity={event.severity.value} {event.detail}")
    for gap in parsed.unavailable:
        where = gap.gpu.label() if gap.gpu else "host"
        print(f"not available: {gap.what} on {where}{f' link {gap.link}' if gap.link is not None else ''}: {gap.detail}")
    print(f"parse: {parsed.lines_read} lines, {parsed.rejected} rejected {dict(parsed.rejects)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
