"""Telemetry the ingest service filed (``telemetry.json``): what is only shown is summarized as it is
read, within a budget, whatever a key sent (issue 30, §3)."""

from __future__ import annotations

import json
from pathlib import Path

from denpex.evidence.store import LocalStore
from denpex.hardware.stored_telemetry import MAX_SHOWN_GROUPS, load_stored_telemetry, untrusted_notes


def _xid(n: int, host: str, code: int = 79) -> str:
    return (f"2026-11-29T20:{n // 60 % 60:02d}:{n % 60:02d}+0000 {host} kernel: NVRM: Xid (PCI:0000:3b:00): {code}, "
            f"pid={n}, GPU has fallen off the bus.\n")


def _incident(tmp_path: Path, untrusted: dict[str, str], trusted: dict[str, tuple[str, str]] | None = None) -> LocalStore:
    for name, text in {**untrusted, **{n: t for n, (_, t) in (trusted or {}).items()}}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    index = {"trusted": [{"name": n, "host": h} for n, (h, _) in (trusted or {}).items()], "untrusted": list(untrusted)}
    (tmp_path / "telemetry.json").write_text(json.dumps(index))
    return LocalStore(tmp_path)


def test_repeated_events_make_one_note_per_kind_and_host_with_counts(tmp_path: Path) -> None:
    lines = "".join(_xid(n, f"gpu-node-00{n % 2 + 1}", 79 if n % 3 else 31) for n in range(3000))
    stored = load_stored_telemetry(_incident(tmp_path, {"telemetry/untrusted/a.log": lines}))
    assert stored is not None and stored.shown.events == 3000
    notes = untrusted_notes(stored.shown)
    assert len(notes) == 2, notes
    assert notes[0].startswith("xid on gpu-node-001: 1,500 events (xid 79 x1,000, xid 31 x500) from ")
    assert all("never support isolation" in note for note in notes)


def test_a_host_name_per_line_cannot_grow_the_notes(tmp_path: Path) -> None:
    lines = "".join(_xid(n, f"host-{n}") for n in range(5000))
    stored = load_stored_telemetry(_incident(tmp_path, {"telemetry/untrusted/a.log": lines}))
    assert stored is not None
    notes = untrusted_notes(stored.shown)
    assert len(notes) == MAX_SHOWN_GROUPS + 1
    assert notes[-1].startswith(f"{5000 - MAX_SHOWN_GROUPS:,} more events on at least 2,016 other kinds and hosts")


def test_what_is_only_shown_is_read_within_a_budget_and_the_rest_is_named(tmp_path: Path) -> None:
    parts = {f"telemetry/untrusted/{i}.log": "".join(_xid(n, "gpu-node-001") for n in range(1000)) for i in range(4)}
    size = len(next(iter(parts.values())).encode())
    stored = load_stored_telemetry(_incident(tmp_path, parts), max_shown_bytes=size + size // 2)
    assert stored is not None and 1000 < stored.shown.events < 1600
    assert (stored.shown.unread_files, 0 < stored.shown.unread_bytes < size) == (2, True)
    assert "and 2 more files of telemetry from keys that are not the hosts' node-agent keys were not read" in \
        untrusted_notes(stored.shown)[-1]


def test_the_flow_reads_only_what_may_support_isolation(tmp_path: Path) -> None:
    """A node agent's own lines are read whole; what is only shown is not read at all (here it could not be)."""
    own = "".join(_xid(n, "gpu-node-003") for n in range(3)) + _xid(9, "gpu-node-004")
    store = _incident(tmp_path, {}, {"telemetry/trusted/gpu-node-003-x.log": ("gpu-node-003", own)})
    index = json.loads((tmp_path / "telemetry.json").read_text())
    (tmp_path / "telemetry.json").write_text(json.dumps({**index, "untrusted": ["telemetry/untrusted/gone.log"]}))
    stored = load_stored_telemetry(store, shown=False)
    assert stored is not None and [e.host for e in stored.trusted.events] == ["gpu-node-003"] * 3
    assert stored.shown.events == 0
    shown = load_stored_telemetry(_incident(tmp_path / "b", {}, {"t/own.log": ("gpu-node-003", own)}))
    assert shown is not None and untrusted_notes(shown.shown) == [
        "xid 79 on gpu-node-004 at 2026-11-29T20:00:09+00:00: reported with a job's key, not the host's node-agent "
        "key, so it is shown here and never supports isolation"]
