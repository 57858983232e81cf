"""Golden files: a whole kernel log capture in, the expected events out (one runner for every case).

Each ``golden/NAME.log`` is parsed and compared with ``golden/NAME.expected.json``, which lists,
per event, only the fields that matter for that event.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from denpex.hardware import load_telemetry

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.stem for p in GOLDEN.glob("*.log"))


def project(event: dict, keys: list[str]) -> dict:
    view = {k: event[k] for k in keys if k != "gpu"}
    if "gpu" in keys:
        view["gpu"] = event["gpu"]["pci_bus_id"] if event["gpu"] else None
    if "time" in view:
        view["time"] = view["time"].replace("+00:00", "Z")
    return view


@pytest.mark.parametrize("case", CASES)
def test_golden(case: str) -> None:
    expected = json.loads((GOLDEN / f"{case}.expected.json").read_text())
    result = load_telemetry([GOLDEN / f"{case}.log"])
    events = [e.model_dump(mode="json") for e in result.events]
    assert [project(e, list(x)) for e, x in zip(events, expected["events"])] == expected["events"]
    assert len(events) == len(expected["events"])
    assert [g.gpu.model_dump(exclude_none=True) for g in result.gpus] == expected["gpus"]
    assert result.continuation_lines == expected["continuation_lines"]
    assert {k.value: v for k, v in result.rejects.items()} == expected["rejects"]
