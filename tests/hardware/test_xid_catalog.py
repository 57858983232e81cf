"""The Xid catalog is data: its buckets follow the operator table, and a bad file fails loudly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from denpex.hardware import CatalogError, Severity, XidBucket, default_xid_catalog, load_xid_catalog

BUCKETS = {
    XidBucket.APPLICATION: {13, 31, 68, 69, 94},
    XidBucket.WATCH: {43, 63, 92},
    XidBucket.NAMED_WORKFLOW: {45, 48, 74},
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
