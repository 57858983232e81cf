"""Pure parts of the ingest service: alert parsing, versioning, the manifest writer, layout."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from denpex.evidence.fr_dump import DumpEncoding
from denpex.evidence.store import LocalStore
from denpex.ingest.alerts import AlertStatus, parse_alertmanager, parse_denpex_alert, parse_watchdog_line
from denpex.ingest.database import Database
from denpex.ingest.errors import ForbiddenError, InvalidRequestError
from denpex.ingest.evidence_intake import _version_for
from denpex.ingest.identity import UploadIdentity, parse_identity
from denpex.ingest.incidents import IncidentBook, IncidentKey, StoredUpload, alert_id_for
from denpex.ingest.manifest_writer import ManifestWriter

NOW = datetime(2026, 12, 1, 13, 0, tzinfo=UTC)


@pytest.mark.parametrize("line, rank, pg, seq, op", [
    ("[rank3]:[E1201 13:09:14.540958 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank 3] Watchdog "
     "caught collective operation timeout: WorkNCCL(SeqNum=16, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
     "Timeout(ms)=600000) ran for 600011 milliseconds before timing out.", 3, "0", 16, "ALLREDUCE"),
    ("[E ProcessGroupNCCL.cpp:475] [Rank 5] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
     "OpType=BROADCAST, NumelIn=4, NumelOut=4, Timeout(ms)=1800000) ran for 1800555 milliseconds before timing out.",
     5, None, 7, "BROADCAST"),
    ("[rank12]:[E1201 ProcessGroupNCCL.cpp:632] [PG ID 2 PG GUID 5d3f2a(mesh_tp) Rank 4] Watchdog caught "
     "collective operation timeout: WorkNCCL(SeqNum=99, OpType=_ALLGATHER_BASE, NumelIn=8, NumelOut=64, "
     "Timeout(ms)=600000) ran for 600100 milliseconds before timing out.", 4, "5d3f2a", 99, "_ALLGATHER_BASE"),
], ids=["torch-2.4+", "older", "subgroup"])
def test_watchdog_lines(line: str, rank: int, pg: str | None, seq: int, op: str) -> None:
    parsed = parse_watchdog_line(line)
    assert (parsed.rank, parsed.process_group, parsed.collective_seq_id, parsed.op) == (rank, pg, seq, op)


def test_alertmanager_payload() -> None:
    body = json.dumps({"version": "4", "status": "firing", "alerts": [
        {"status": "firing", "labels": {"job_id": "j1", "rank": "3", "tenant": "acme", "hostname": "gpu-node-004"},
         "startsAt": "2026-12-01T13:09:14.123456789Z", "endsAt": "0001-01-01T00:00:00Z"},
        {"status": "resolved", "labels": {"job_id": "j1", "incident_id": "i-1"}, "startsAt": "2026-12-01T13:00:00Z"}]})
    firing, resolved = parse_alertmanager(body.encode(), tenant="acme", cluster="c1", received_at=NOW)
    assert (firing.rank, firing.hostname, firing.status) == (3, "gpu-node-004", AlertStatus.FIRING)
    assert firing.alert_time == datetime(2026, 12, 1, 13, 9, 14, 123456, tzinfo=UTC)
    assert resolved.status is AlertStatus.RESOLVED and resolved.incident_id == "i-1"
    with pytest.raises(ForbiddenError):
        parse_alertmanager(body.replace('"acme"', '"globex"').encode(), tenant="acme", cluster="c1", received_at=NOW)
    with pytest.raises(InvalidRequestError, match=r"alerts\[0\]: no 'job_id' label"):
        parse_alertmanager(b'{"version": "4", "alerts": [{"labels": {}}]}', tenant="acme", cluster="c1", received_at=NOW)
    with pytest.raises(InvalidRequestError, match="version 4"):
        parse_alertmanager(b'{"version": "3", "alerts": []}', tenant="acme", cluster="c1", received_at=NOW)


def test_denpex_alert_refuses_unknown_fields_and_bad_ids() -> None:
    assert parse_denpex_alert(b'{"job_id": "j1"}', received_at=NOW).alert_time == NOW
    with pytest.raises(InvalidRequestError, match="hots"):
        parse_denpex_alert(b'{"job_id": "j1", "hots": "x"}', received_at=NOW)
    with pytest.raises(InvalidRequestError, match="job_id"):
        parse_denpex_alert(b'{"job_id": "../etc"}', received_at=NOW)


def test_identity_is_checked() -> None:
    with pytest.raises(InvalidRequestError, match="incident_id"):
        parse_identity(b'{"job_id": "j", "incident_id": "a/b", "rank": 0, "world_size": 2}')
    with pytest.raises(InvalidRequestError, match="outside world_size"):
        parse_identity(b'{"job_id": "j", "incident_id": "i", "rank": 0, "world_size": 2, '
                       b'"process_groups": {"0": {"ranks": [0, 5]}}}')


def _upload(version: int, encoding: DumpEncoding, dumped_at: str | None) -> StoredUpload:
    ident = {"job_id": "j", "incident_id": "i", "rank": 0, "world_size": 2} | ({"dumped_at": dumped_at} if dumped_at else {})
    return StoredUpload(rank=0, version=version, encoding=encoding, sha256="x", object_name="o", key_id="k",
                        identity=json.dumps(ident), uploaded_at=0.0)


@pytest.mark.parametrize("earlier, encoding, dumped_at, version", [
    ([], DumpEncoding.PICKLE, None, 1),
    ([_upload(1, DumpEncoding.PICKLE, "2026-12-01T13:00:00+00:00")], DumpEncoding.JSON, "2026-12-01T13:00:00+00:00", 1),
    ([_upload(1, DumpEncoding.PICKLE, "2026-12-01T13:00:00+00:00")], DumpEncoding.JSON, "2026-12-01T13:05:00+00:00", 2),
    ([_upload(1, DumpEncoding.PICKLE, "2026-12-01T13:00:00+00:00")], DumpEncoding.PICKLE, "2026-12-01T13:00:00+00:00", 2),
    ([_upload(1, DumpEncoding.PICKLE, None)], DumpEncoding.JSON, None, 2),
], ids=["first", "json-of-same-moment", "json-of-later-moment", "other-pickle", "no-moment-known"])
def test_versions(earlier: list[StoredUpload], encoding: DumpEncoding, dumped_at: str | None, version: int) -> None:
    ident = UploadIdentity.model_validate({"job_id": "j", "incident_id": "i", "rank": 0, "world_size": 2,
                                           **({"dumped_at": dumped_at} if dumped_at else {})})
    assert _version_for(earlier, encoding, ident) == version


def test_manifest_writer_coalesces_and_rebuilds_after_a_restart(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "evidence")
    book = IncidentBook(Database(tmp_path / "state"))
    key = IncidentKey("acme", "c1", "i-1")
    writer = ManifestWriter(store, book, interval_s=3600)
    for rank in range(3):
        ident = UploadIdentity(job_id="j", incident_id="i-1", rank=rank, world_size=4, host=f"h{rank}")
        book.record_upload(key, "j", StoredUpload(rank=rank, version=1, encoding=DumpEncoding.PICKLE, sha256=str(rank),
                                                  object_name="o", key_id="k", identity=ident.model_dump_json(),
                                                  uploaded_at=0.0), 4, [])
        writer.add(key, ident)
    manifest_path = tmp_path / "evidence" / "acme" / "c1" / "j" / "i-1" / "manifest.json"
    assert not manifest_path.exists()  # not yet: written per interval, not per upload
    writer.close()
    assert set(json.loads(manifest_path.read_text())["ranks"]) == {"0", "1", "2"}
    # A new process learns the earlier identities from the database.
    again = ManifestWriter(store, book, interval_s=3600)
    again.add(key, UploadIdentity(job_id="j", incident_id="i-1", rank=3, world_size=4))
    again.close()
    assert set(json.loads(manifest_path.read_text())["ranks"]) == {"0", "1", "2", "3"}


def test_alert_id_is_one_per_incident() -> None:
    assert alert_id_for(IncidentKey("a", "c", "i")) == alert_id_for(IncidentKey("a", "c", "i"))
    assert alert_id_for(IncidentKey("a", "c", "i")) != alert_id_for(IncidentKey("b", "c", "i"))


def test_a_state_directory_from_before_telemetry_sizes_gains_the_column(tmp_path: Path) -> None:
    """Issue 30: the telemetry caps count bytes per key; an older database is given the column when opened."""
    import sqlite3

    old = sqlite3.connect(tmp_path / "ingest.sqlite3")
    old.execute("CREATE TABLE telemetry (tenant TEXT NOT NULL, cluster TEXT NOT NULL, incident_id TEXT NOT NULL, "
                "sha256 TEXT NOT NULL, object_name TEXT NOT NULL, trusted INTEGER NOT NULL, host TEXT, key_id TEXT "
                "NOT NULL, uploaded_at REAL NOT NULL, PRIMARY KEY (tenant, cluster, incident_id, sha256, trusted))")
    old.execute("INSERT INTO telemetry VALUES ('acme', 'c1', 'inc-1', 'ab', 'telemetry/untrusted/ab.log', 0, NULL, "
                "'dk_1', 1.0)")
    old.commit()
    old.close()
    book = IncidentBook(Database(tmp_path))
    Database(tmp_path)  # opened again: nothing to add
    [kept] = book.telemetry(IncidentKey("acme", "c1", "inc-1"))
    assert (kept.key_id, kept.size) == ("dk_1", None)  # counted as no bytes by the caps
