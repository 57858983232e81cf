"""The hash-chained audit log: append, verify, tamper detection, dangling intents, store copy."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import boto3
import pytest
from moto import mock_aws
from typer.testing import CliRunner

from denpex.cli import app
from denpex.evidence.store import LocalStore, S3Store
from denpex.isolation.audit import (
    GENESIS_HASH,
    AuditEntry,
    AuditKind,
    AuditLog,
    Outcome,
    verify_audit_log,
)
from denpex.isolation.audit_store import copy_audit_log
from denpex.isolation.errors import AuditError, StoreError
from denpex.isolation.plan import Operation
from isolation.triage_cases import NOW

PLAN = "a" * 64


def entry(kind: AuditKind, node: str = "gpu-node-002", **extra: object) -> AuditEntry:
    return AuditEntry.model_validate({
        "kind": kind, "incident_id": "inc-42", "plan_hash": PLAN, "operation": Operation.ISOLATE,
        "approver": "alice", "node": node, "action": "drain",
        "command": "scontrol update NodeName=gpu-node-002 State=DRAIN 'Reason=denpex:inc-42 x'", **extra,
    })


@pytest.fixture
def log(tmp_path: Path) -> AuditLog:
    audit = AuditLog(tmp_path / "audit.jsonl")
    intent = audit.append(entry(AuditKind.INTENT), at=NOW)
    audit.append(entry(AuditKind.RESULT, rc=0, output="", outcome=Outcome.APPLIED, intent_seq=intent.seq,
                       state="IDLE+DRAIN"), at=NOW + timedelta(seconds=1))
    audit.append(entry(AuditKind.INTENT, node="gpu-node-005"), at=NOW + timedelta(seconds=2))
    return audit


def test_records_are_chained_and_verify(log: AuditLog) -> None:
    records = log.records()
    assert [r.seq for r in records] == [1, 2, 3]
    assert records[0].prev_hash == GENESIS_HASH
    assert [r.prev_hash for r in records[1:]] == [r.hash for r in records[:-1]]
    assert all(r.hash == r.expected_hash() for r in records)
    verification = verify_audit_log(log.path)
    assert verification.ok and verification.records == 3


def test_intent_without_result_is_pending(log: AuditLog) -> None:
    [pending] = log.pending_intents(PLAN, Operation.ISOLATE)
    assert pending.node == "gpu-node-005" and pending.seq == 3
    assert log.pending_intents(PLAN, Operation.ROLLBACK) == []
    assert log.pending_intents("b" * 64, Operation.ISOLATE) == []


def _rewrite(path: Path, change) -> None:
    lines = path.read_text().splitlines()
    change(lines)
    path.write_text("\n".join(lines) + "\n")


def _edit_rc(lines: list[str]) -> None:
    record = json.loads(lines[1])
    record["rc"] = 1
    lines[1] = json.dumps(record, sort_keys=True, separators=(",", ":"))


def _edit_and_rehash(lines: list[str]) -> None:
    # A careful forger recomputes the edited line's hash; the next line's prev_hash still breaks.
    from denpex.isolation.audit import AuditRecord
    from denpex.isolation.plan import canonical_json

    record = AuditRecord.model_validate_json(lines[0]).model_copy(update={"approver": "mallory"})
    record = record.model_copy(update={"hash": record.expected_hash()})
    lines[0] = canonical_json(record.model_dump(mode="json"))


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        pytest.param(_edit_rc, "line 2 (seq 2): content does not match its hash", id="edited-field"),
        pytest.param(_edit_and_rehash, "line 2 (seq 2): prev_hash does not match", id="edited-and-rehashed"),
        pytest.param(lambda lines: lines.pop(1), "prev_hash does not match", id="deleted-line"),
        pytest.param(lambda lines: lines.insert(0, lines.pop(1)), "prev_hash does not match", id="reordered"),
        pytest.param(lambda lines: lines.__setitem__(2, "{not json"), "line 3: not an audit record", id="garbage"),
    ],
)
def test_verify_names_the_tampered_line(log: AuditLog, change, needle: str) -> None:
    _rewrite(log.path, change)
    verification = verify_audit_log(log.path)
    assert not verification.ok
    assert any(needle in p for p in verification.problems), verification.problems


def test_cli_audit_verify_detects_an_edited_line(log: AuditLog) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["audit", "verify", str(log.path)])
    assert ok.exit_code == 0 and "3 records, chain intact" in ok.stdout
    _rewrite(log.path, _edit_rc)
    bad = runner.invoke(app, ["audit", "verify", str(log.path)])
    assert bad.exit_code == 2
    assert "line 2 (seq 2): content does not match its hash; the line was edited" in bad.stderr


def test_append_refuses_to_extend_a_tampered_or_torn_log(log: AuditLog) -> None:
    _rewrite(log.path, lambda lines: lines.__setitem__(2, lines[2].replace("gpu-node-005", "gpu-node-006")))
    with pytest.raises(AuditError, match="was altered"):
        log.append(entry(AuditKind.INTENT), at=NOW)
    log.path.write_text(log.path.read_text() + '{"kind": "inte')
    with pytest.raises(AuditError, match="cut short"):
        log.append(entry(AuditKind.INTENT), at=NOW)
    assert any("cut short" in p for p in verify_audit_log(log.path).problems)


def test_long_output_is_cut_but_chained(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "a.jsonl")
    record = audit.append(entry(AuditKind.RESULT, output="x" * 10000), at=NOW)
    assert len(record.output or "") < 4100 and verify_audit_log(audit.path).ok


def test_copy_to_a_local_evidence_store(log: AuditLog, tmp_path: Path) -> None:
    uri = copy_audit_log(log, LocalStore(tmp_path / "store"), "inc-42")
    assert uri.endswith("audit/inc-42/audit.jsonl")
    assert (tmp_path / "store" / "audit" / "inc-42" / "audit.jsonl").read_bytes() == log.path.read_bytes()


def test_copy_to_s3(log: AuditLog) -> None:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="incidents")
        uri = copy_audit_log(log, S3Store("incidents", "denpex", client=client), "inc-42")
        assert uri == "s3://incidents/denpex/audit/inc-42/audit.jsonl"
        body = client.get_object(Bucket="incidents", Key="denpex/audit/inc-42/audit.jsonl")["Body"].read()
        assert body == log.path.read_bytes()
        with pytest.raises(StoreError, match="local copy at"):
            copy_audit_log(log, S3Store("no-such-bucket", client=client), "inc-42")


def test_a_record_longer_than_the_tail_window_does_not_block_the_next_append(tmp_path: Path) -> None:
    # A node running thousands of jobs: the intent lists them all, well over 64 KiB.
    audit = AuditLog(tmp_path / "audit.jsonl")
    jobs = tuple(f"{1000000 + i}_{i}" for i in range(12000))
    audit.append(entry(AuditKind.INTENT, running_jobs=jobs), at=NOW)
    assert audit.path.stat().st_size > 128 * 1024
    result = audit.append(entry(AuditKind.RESULT, intent_seq=1, outcome=Outcome.APPLIED), at=NOW)
    assert result.seq == 2 and verify_audit_log(audit.path).ok


@pytest.mark.parametrize("text", ["a\u2028b", "a\x85b", "a\u2029b", "a\x0cb"],
                         ids=["line-separator", "next-line", "paragraph-separator", "form-feed"])
def test_text_that_python_counts_as_a_line_break_does_not_break_the_chain(tmp_path: Path, text: str) -> None:
    # Remote output is copied into the record; the log's lines end at "\n" only.
    audit = AuditLog(tmp_path / "audit.jsonl")
    audit.append(entry(AuditKind.RESULT, output=text, outcome=Outcome.APPLIED), at=NOW)
    audit.append(entry(AuditKind.SKIP, outcome=Outcome.ALREADY_DONE), at=NOW)
    verification = verify_audit_log(audit.path)
    assert verification.ok and verification.records == 2, verification.problems


_FULL_DISK = """
import resource, signal, sys
from datetime import UTC, datetime
from pathlib import Path
from denpex.isolation.audit import AuditEntry, AuditLog
from denpex.isolation.errors import AuditError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
path = Path(sys.argv[1])
size = path.stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, size + 100))
try:
    AuditLog(path).append(AuditEntry.model_validate_json(sys.argv[2]), at=datetime.now(UTC))
except AuditError as exc:
    print("AuditError:", exc)
"""


def test_a_failed_write_leaves_no_torn_line_and_says_so(log: AuditLog) -> None:
    # The disk fills (here: a file size limit) in the middle of writing an intent.
    before = log.path.read_bytes()
    big = entry(AuditKind.INTENT, node="gpu-node-007", output="x" * 3000).model_dump_json()
    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(log.path), big],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("AuditError:") and str(log.path) in done.stdout
    assert "nothing was sent" in done.stdout
    assert log.path.read_bytes() == before
    assert verify_audit_log(log.path).ok and log.append(entry(AuditKind.SKIP), at=NOW).seq == 4


def test_a_torn_last_line_names_the_safe_repair(log: AuditLog) -> None:
    intact = log.path.stat().st_size
    log.path.write_bytes(log.path.read_bytes() + b'{"kind":"result","incident_id":"inc-42","pl')
    with pytest.raises(AuditError, match=rf"truncate -s {intact} {log.path}"):
        log.append(entry(AuditKind.INTENT), at=NOW)
    with pytest.raises(AuditError, match=rf"truncate -s {intact} "):
        log.pending_intents(PLAN, Operation.ISOLATE)
    problems = verify_audit_log(log.path).problems
    assert any(f"truncate -s {intact}" in p for p in problems), problems


def test_a_log_cut_at_a_record_boundary_is_caught_against_its_stored_copy(log: AuditLog, tmp_path: Path) -> None:
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(log.path.read_bytes())
    lines = log.path.read_bytes().splitlines(keepends=True)
    log.path.write_bytes(b"".join(lines[:1]))  # the last two records are gone, the chain still holds
    alone = verify_audit_log(log.path)
    assert alone.ok and alone.records == 1 and alone.last is not None and alone.last.seq == 1
    against = verify_audit_log(log.path, reference=copy)
    assert not against.ok
    assert any("seq 2 to 3" in p and "truncated" in p for p in against.problems), against.problems
    # A copy that the log extends is fine; one that disagrees is not.
    log.path.write_bytes(b"".join(lines))
    assert verify_audit_log(log.path, reference=copy).ok
    edited = copy.read_text().replace("gpu-node-005", "gpu-node-006")
    copy.write_text(edited)
    assert any("differs" in p for p in verify_audit_log(log.path, reference=copy).problems)


def test_cli_verify_reports_the_head_and_checks_a_copy(log: AuditLog, tmp_path: Path) -> None:
    runner = CliRunner()
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(log.path.read_bytes())
    last = log.records()[-1]
    ok = runner.invoke(app, ["audit", "verify", str(log.path), "--against", str(copy)])
    assert ok.exit_code == 0, ok.output
    assert f"3 records, chain intact, last seq 3 at {last.time.isoformat()} (hash {last.hash[:12]})" in ok.stdout
    log.path.write_bytes(b"".join(log.path.read_bytes().splitlines(keepends=True)[:2]))
    cut = runner.invoke(app, ["audit", "verify", str(log.path), "--against", str(copy)])
    assert cut.exit_code == 2 and "truncated" in cut.stderr


_APPENDER = """
import sys
from datetime import UTC, datetime
from pathlib import Path
from denpex.isolation.audit import AuditEntry, AuditLog
log = AuditLog(Path(sys.argv[1]))
for _ in range(int(sys.argv[3])):
    log.append(AuditEntry.model_validate_json(sys.argv[2]), at=datetime.now(UTC))
"""


def test_concurrent_writers_keep_one_unbroken_chain(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    body = entry(AuditKind.SKIP, outcome=Outcome.ALREADY_DONE).model_dump_json()
    writers = [subprocess.Popen([sys.executable, "-c", _APPENDER, str(path), body, "40"]) for _ in range(4)]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0, 0]
    verification = verify_audit_log(path)
    assert verification.ok and verification.records == 160, verification.problems


def test_two_runs_creating_the_audit_key_at_once_get_the_same_whole_key(tmp_path: Path) -> None:
    """Two operators' first runs on a machine: the second must never read the first's key file
    half-written (an empty key is 'damaged', a refusal nobody retries)."""
    import threading

    from denpex.isolation.audit import load_or_create_audit_key

    for attempt in range(100):
        path = tmp_path / f"state-{attempt}" / "audit.key"
        got: list[object] = []

        def first_use() -> None:
            try:
                got.append(load_or_create_audit_key(path))
            except Exception as exc:  # noqa: BLE001 - the test reports whatever a run would see
                got.append(exc)

        runs = [threading.Thread(target=first_use) for _ in range(4)]
        for run in runs:
            run.start()
        for run in runs:
            run.join()
        assert all(isinstance(key, bytes) for key in got) and len(set(got)) == 1, got
        assert path.stat().st_mode & 0o777 == 0o600


def test_an_unkeyed_writer_cannot_append_to_a_keyed_log(tmp_path: Path) -> None:
    # The flow once wrote its "not done" decisions without the key; the next approved drain then
    # refused the whole log ("line 1: its mac does not verify").
    from denpex.isolation.audit import AuditChainError
    from denpex.isolation.operator import state_audit_log

    keyed = state_audit_log(tmp_path)
    keyed.append(entry(AuditKind.INTENT), at=NOW)
    with pytest.raises(AuditChainError, match="is keyed"):
        AuditLog(keyed.path).append(entry(AuditKind.DECISION), at=NOW)
    again = state_audit_log(tmp_path)
    again.append(entry(AuditKind.DECISION), at=NOW)
    again.verify()
    assert [r.seq for r in again.records()] == [1, 2]


def test_a_record_written_without_the_key_is_named_as_such(tmp_path: Path) -> None:
    from denpex.isolation.operator import AUDIT_KEY_NAME, state_audit_log

    AuditLog(tmp_path / "audit.jsonl").append(entry(AuditKind.DECISION), at=NOW)  # an unkeyed writer
    keyed = state_audit_log(tmp_path)
    key = bytes.fromhex((tmp_path / AUDIT_KEY_NAME).read_text().strip())
    problems = verify_audit_log(keyed.path, key=key).problems
    assert problems and "written without the log's key" in problems[0] and "forged" not in problems[0]


def test_an_audit_key_file_is_read_within_a_cap(tmp_path: Path) -> None:
    """A path named by mistake (a log, a dump) is not read whole as a key (review of issue 32)."""
    from denpex.isolation.audit import load_or_create_audit_key, read_audit_key
    from denpex.isolation.errors import ConfigError

    big = tmp_path / "audit.key"
    big.write_text("ab" * 4096)
    big.chmod(0o600)
    with pytest.raises(AuditError, match="cannot read the audit key: the file is over 4096 bytes"):
        load_or_create_audit_key(big)
    with pytest.raises(ConfigError, match="cannot read the audit key: the file is over 4096 bytes"):
        read_audit_key(big)
    big.write_text("ab" * 32 + "\n")
    assert read_audit_key(big) == load_or_create_audit_key(big) == bytes.fromhex("ab" * 32)
