"""The audit log's checked copy, one per cluster: layout, "extends", the crash window, refusals."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from denpex.evidence.store import LocalStore, S3Store
from denpex.isolation.audit import AuditEntry, AuditKind, AuditLog, AuditRecord, Outcome
from denpex.isolation.audit_store import (
    check_extends_stored_copy,
    cluster_slug,
    stored_copy_name,
    update_stored_copy,
)
from denpex.isolation.config import load_settings
from denpex.isolation.errors import AuditChainError, StoreError
from denpex.isolation.operator import load_operator_config, state_audit_log
from denpex.isolation.plan import Operation
from isolation.triage_cases import NOW


def entry(kind: AuditKind, node: str = "gpu-node-002", **extra: object) -> AuditEntry:
    return AuditEntry.model_validate({"kind": kind, "incident_id": "inc-42", "plan_hash": "a" * 64,
                                      "operation": Operation.ISOLATE, "approver": "alice", "node": node,
                                      "action": "drain", **extra})


def append(log: AuditLog, count: int) -> None:
    for i in range(count):
        log.append(entry(AuditKind.SKIP, outcome=Outcome.ALREADY_DONE), at=NOW + timedelta(seconds=i))


def cut(log: AuditLog, keep: int) -> None:
    lines = log.path.read_bytes().splitlines(keepends=True)
    log.path.write_bytes(b"".join(lines[:keep]))


@pytest.fixture
def log(tmp_path: Path) -> AuditLog:
    audit = state_audit_log(tmp_path / "state")
    append(audit, 3)
    return audit


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "audit-store")


def test_the_copy_and_its_head_live_under_the_cluster(log: AuditLog, store: LocalStore) -> None:
    uri = update_stored_copy(log, store, "Prod East/1")
    assert uri == f"{store.root}/prod-east-1/audit.jsonl"
    assert (store.root / "prod-east-1" / "audit.jsonl").read_bytes() == log.path.read_bytes()
    head = AuditRecord.model_validate_json((store.root / "prod-east-1" / "head.json").read_bytes())
    assert head == log.records()[-1] and head.mac is not None
    assert cluster_slug("lab") == "lab" and stored_copy_name("lab") == "lab/audit.jsonl"


def test_a_longer_log_extends_its_copy_the_crash_window(log: AuditLog, store: LocalStore) -> None:
    update_stored_copy(log, store, "lab")
    append(log, 2)  # appended, then the writer died before it copied
    check_extends_stored_copy(log, store, "lab")
    update_stored_copy(log, store, "lab")
    assert (store.root / "lab" / "audit.jsonl").read_bytes() == log.path.read_bytes()


def test_no_copy_yet_passes(log: AuditLog, store: LocalStore) -> None:
    check_extends_stored_copy(log, store, "lab")


def test_a_log_cut_back_before_the_copys_head_is_refused(log: AuditLog, store: LocalStore) -> None:
    update_stored_copy(log, store, "lab")
    stored = (store.root / "lab" / "audit.jsonl").read_bytes()
    cut(log, 1)
    log.verify()  # the chain alone does not show it
    with pytest.raises(AuditChainError, match=r"does not extend its stored copy .*lab/audit.jsonl: the copy "
                                              r"goes up to seq 3 .* this log ends at seq 1: it was cut back"):
        check_extends_stored_copy(log, store, "lab")
    with pytest.raises(AuditChainError, match="the copy was left as it was"):
        update_stored_copy(log, store, "lab")
    assert (store.root / "lab" / "audit.jsonl").read_bytes() == stored


def test_a_log_cut_then_written_again_diverges(log: AuditLog, store: LocalStore) -> None:
    update_stored_copy(log, store, "lab")
    cut(log, 1)
    append(log, 3)  # as long as the copy again, and longer
    with pytest.raises(AuditChainError, match="holds another record at seq 3"):
        check_extends_stored_copy(log, store, "lab")


def test_a_removed_log_is_refused(log: AuditLog, store: LocalStore) -> None:
    update_stored_copy(log, store, "lab")
    log.path.unlink()
    with pytest.raises(AuditChainError, match="this log has no record"):
        check_extends_stored_copy(log, store, "lab")


def test_each_cluster_is_checked_against_its_own_copy(log: AuditLog, store: LocalStore) -> None:
    """One machine-wide log, one copy per cluster, each the whole log as of that cluster's write."""
    update_stored_copy(log, store, "east")
    append(log, 2)
    update_stored_copy(log, store, "west")
    cut(log, 3)  # west's two records are gone; east's copy ends at seq 3
    check_extends_stored_copy(log, store, "east")
    with pytest.raises(AuditChainError, match="seq 5"):
        check_extends_stored_copy(log, store, "west")


def test_an_edited_head_is_refused(log: AuditLog, store: LocalStore) -> None:
    update_stored_copy(log, store, "lab")
    head_path = store.root / "lab" / "head.json"
    body = json.loads(head_path.read_text())
    body["seq"] = 1  # an older head, to let a cut log pass
    head_path.write_text(json.dumps(body))
    with pytest.raises(AuditChainError, match="does not verify with this log's key"):
        check_extends_stored_copy(log, store, "lab")


def test_the_head_is_read_from_the_copy_when_missing(log: AuditLog, store: LocalStore) -> None:
    update_stored_copy(log, store, "lab")
    (store.root / "lab" / "head.json").unlink()  # died between the copy and its head
    cut(log, 2)
    with pytest.raises(AuditChainError, match="goes up to seq 3"):
        check_extends_stored_copy(log, store, "lab")


def test_the_copy_in_s3(log: AuditLog) -> None:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="audit")
        store = S3Store("audit", "denpex", client=client)
        assert update_stored_copy(log, store, "lab") == "s3://audit/denpex/lab/audit.jsonl"
        assert client.get_object(Bucket="audit", Key="denpex/lab/audit.jsonl")["Body"].read() == \
            log.path.read_bytes()
        cut(log, 2)
        with pytest.raises(AuditChainError, match="s3://audit/denpex/lab/audit.jsonl"):
            check_extends_stored_copy(log, store, "lab")
        with pytest.raises(StoreError, match="cannot be checked"):
            check_extends_stored_copy(log, S3Store("no-such-bucket", client=client), "lab")


def test_the_audit_store_is_the_operators_setting(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    default = load_operator_config(load_settings(None, {"DENPEX_STATE_DIR": state}), {"DENPEX_STATE_DIR": state})
    assert default.audit_store_uri == f"{state}/audit-store"
    env = {"DENPEX_STATE_DIR": state, "DENPEX_AUDIT_STORE": "s3://audit/denpex"}
    assert load_operator_config(load_settings(None, env), env).audit_store_uri == "s3://audit/denpex"
    # The flow's settings come from a target block, which names no audit store: the environment does.
    from denpex.isolation.config import IsolationSettings

    from_block = IsolationSettings(state_dir=Path(state), cluster="lab")
    assert load_operator_config(from_block, env).audit_store_uri == "s3://audit/denpex"
