"""A folder of a local store is reached as the store reads files: never through a symbolic link
(attacker review: a linked ``telemetry/`` led the flow to read telemetry from outside the incident)."""

from __future__ import annotations

from pathlib import Path

import pytest

from denpex.evidence.errors import EvidenceSourceError
from denpex.evidence.store import LocalStore
from denpex.workflow.telemetry_files import telemetry_files_in_store

XID = "2026-11-29T20:28:50+0000 gpu-node-003 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"


def test_a_linked_folder_is_refused_and_its_telemetry_not_read(tmp_path: Path) -> None:
    outside, incident = tmp_path / "outside", tmp_path / "incident"
    outside.mkdir()
    incident.mkdir()
    (outside / "kernel.log").write_text(XID)
    (incident / "telemetry").symlink_to(outside)
    store = LocalStore(incident)
    with pytest.raises(EvidenceSourceError, match="symbolic link"):
        store.folder("telemetry")
    assert telemetry_files_in_store(store).events == []


def test_a_real_folder_is_read(tmp_path: Path) -> None:
    (tmp_path / "telemetry").mkdir()
    (tmp_path / "telemetry" / "kernel.log").write_text(XID)
    store = LocalStore(tmp_path)
    assert [o.name for o in store.folder("telemetry").list()] == ["kernel.log"]
    assert [e.code for e in telemetry_files_in_store(store).events] == [79]
