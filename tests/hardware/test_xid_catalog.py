"""The Xid catalog is data: its buckets follow the operator table, and a bad file fails loudly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from denpex.hardware import CatalogError, Severity, XidBucket, default_xid_catalog, load_xid_catalog

BUCKETS = {
    XidBucket.APPLICATION: {13, 31, 68, 69, 94},
    XidBucket.WATCH: {43, 63, 92},
    XidBucket.NAMED_WORKFLOW: {45, 48, 74, 154},
    XidBucket.RESET_GPU: {46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158},
    XidBucket.REBOOT_NODE: {79},
}


@pytest.mark.parametrize("bucket", list(BUCKETS), ids=[b.value for b in BUCKETS])
def test_buckets_follow_the_operator_table(bucket: XidBucket) -> None:
    catalog = default_xid_catalog()
    assert {e.code for e in catalog.entries if e.bucket is bucket} == BUCKETS[bucket]


@pytest.mark.parametrize(
    ("code", "supports", "application", "severity"),
    [
        pytest.param(79, True, False, Severity.FATAL, id="79-fallen-off-bus"),
        pytest.param(48, True, False, Severity.FATAL, id="48-double-bit-ecc"),
        pytest.param(46, True, False, Severity.FATAL, id="46-critical"),
        pytest.param(13, False, True, Severity.NON_FATAL, id="13-application"),
        pytest.param(31, False, True, Severity.NON_FATAL, id="31-application"),
        pytest.param(43, False, True, Severity.NON_FATAL, id="43-application-per-device-plugin"),
        pytest.param(63, False, False, Severity.NON_FATAL, id="63-watch"),
    ],
)
def test_isolation_support_per_code(code: int, supports: bool, application: bool, severity: Severity) -> None:
    entry = default_xid_catalog().lookup(code)
    assert entry is not None
    assert (entry.supports_isolation, entry.application_error, entry.severity) == (supports, application, severity)


@pytest.mark.parametrize(
    ("action", "supports", "severity", "phrase"),
    [
        pytest.param(0, False, Severity.NON_FATAL, "recovery action now: None", id="0-none"),
        pytest.param(1, True, Severity.FATAL, "recovery action now: GPU Reset Required", id="1-gpu-reset"),
        pytest.param(2, True, Severity.FATAL, "recovery action now: Node Reboot Required", id="2-node-reboot"),
        pytest.param(3, True, Severity.FATAL, "recovery action now: Drain P2P", id="3-drain-p2p"),
        pytest.param(4, True, Severity.FATAL, "recovery action now: Drain and Reset", id="4-drain-and-reset"),
        # A fabric-domain recovery, not a reset, reboot or drain of this GPU.
        pytest.param(5, False, Severity.NON_FATAL, "recovery action now: Recover IMEX Domain", id="5-recover-imex"),
        pytest.param(6, True, Severity.FATAL, "recovery action now: Bus Reset", id="6-bus-reset"),
        pytest.param(7, True, Severity.FATAL, "recovery action now: System Reboot", id="7-system-reboot"),
        pytest.param(9, False, Severity.UNKNOWN, "recovery action now: 0x9, not in Denpex's Xid catalog", id="9-unknown"),
        pytest.param(None, False, Severity.UNKNOWN, "recovery action not logged", id="not-logged"),
    ],
)
def test_xid154_meaning_follows_the_recovery_action(
    action: int | None, supports: bool, severity: Severity, phrase: str
) -> None:
    entry = default_xid_catalog().lookup(154)
    assert entry is not None and entry.bucket is XidBucket.NAMED_WORKFLOW
    assert entry.supports_isolation_for(action) is supports
    assert entry.severity_for(action) is severity
    assert default_xid_catalog().severity_of(154, action) is severity
    assert entry.action_phrase(action) == phrase


def test_codes_without_recovery_actions_ignore_the_action() -> None:
    entry = default_xid_catalog().lookup(79)
    assert entry is not None and entry.supports_isolation_for(0) and entry.action_phrase(0) is None


def test_unknown_code_has_unknown_severity() -> None:
    assert default_xid_catalog().lookup(4242) is None
    assert default_xid_catalog().severity_of(4242) is Severity.UNKNOWN


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        pytest.param(
            [{"code": 79, "name": "a", "bucket": "reboot_node", "supports_isolation": True, "application_error": False}] * 2,
            "more than once", id="duplicate-code",
        ),
        pytest.param(
            [{"code": 62, "name": "a", "bucket": "reset_gpu", "supports_isolation": False, "application_error": False}],
            "must support isolation", id="reset-bucket-without-support",
        ),
        pytest.param(
            [{"code": 1, "name": "a", "bucket": "reboot", "supports_isolation": True, "application_error": False}],
            "bucket", id="unknown-bucket",
        ),
        pytest.param(
            [{"code": 154, "name": "a", "bucket": "named_workflow", "supports_isolation": False,
              "application_error": True, "recovery_actions": {"1": {"name": "GPU Reset Required", "supports_isolation": True}}}],
            "application error", id="recovery-action-on-an-application-error",
        ),
        pytest.param(
            [{"code": 154, "name": "a", "bucket": "named_workflow", "supports_isolation": False,
              "application_error": False, "recovery_actions": {"x": {"name": "b", "supports_isolation": True}}}],
            "recovery_actions", id="recovery-action-not-a-number",
        ),
    ],
)
def test_invalid_catalog_is_refused_with_the_entry_named(tmp_path: Path, entries: list[dict], message: str) -> None:
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"entries": entries}))
    with pytest.raises(CatalogError, match=message):
        load_xid_catalog(path)


def test_unreadable_catalog_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="missing.json"):
        load_xid_catalog(tmp_path / "missing.json")
