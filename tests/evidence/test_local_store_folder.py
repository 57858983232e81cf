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


@pytest.mark.parametrize("name", ["", ".", "a//b", "a/", "/etc", "..", "a/../b"])
def test_a_folder_name_that_is_not_plain_is_refused_as_by_the_s3_store(tmp_path: Path, name: str) -> None:
    with pytest.raises(EvidenceSourceError, match="not a plain path"):
        LocalStore(tmp_path).folder(name)


def test_a_link_anywhere_on_the_way_is_refused(tmp_path: Path) -> None:
    """Attacker review: ``mid -> <another incident>`` made ``folder("mid/telemetry")`` read it."""
    other, incident = tmp_path / "other-tenant", tmp_path / "incident"
    (other / "telemetry").mkdir(parents=True)
    (other / "telemetry" / "kernel.log").write_text(XID)
    incident.mkdir()
    (incident / "mid").symlink_to(other)
    with pytest.raises(EvidenceSourceError, match="symbolic link"):
        LocalStore(incident).folder("mid/telemetry")


@pytest.mark.parametrize("name", ["a\x00b", "tele\nmetry", "x\x7f"])
def test_a_control_character_is_no_folder_name(tmp_path: Path, name: str) -> None:
    from denpex.evidence.store import S3Store

    with pytest.raises(EvidenceSourceError, match="not a plain path"):
        LocalStore(tmp_path).folder(name)
    with pytest.raises(EvidenceSourceError, match="not a plain path"):
        S3Store("evidence", "acme", client=object()).folder(name)
