"""docs/contracts.md stays true to the code: every example in it parses and validates against the
model it names, with no field the model does not know; the telemetry examples are read by Denpex's
own reader; the signing test vector is computed again; and the sections other documents point to
are there."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from denpex.evidence.manifest import JobManifest
from denpex.hardware import SignalKind, parse_telemetry_lines
from denpex.ingest.alert_event import AlertEvent
from denpex.ingest.alerts import DenpexAlert, parse_alertmanager
from denpex.ingest.identity import UploadIdentity
from denpex.ingest.registration import Registration
from denpex.ingest.signing import body_sha256, sign, sign_v2, signed_headers
from denpex.isolation.approval import Approval
from denpex.report import TriageReport
from denpex.workflow.flow_parameters import check_evidence_binding, check_flow_parameters

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "contracts.md"
EXAMPLE = re.compile(r"<!-- validate: ([a-z0-9-]+) -->\n```(\w+)\n(.*?)\n```", re.S)
HEADINGS = ("## Triage", "## Manifest", "## Telemetry", "## Stacks", "## Signed requests", "## Ingest", "## Alert event",
            "## Approvals")


def _examples() -> dict[str, str]:
    found: dict[str, str] = {}
    for name, _, body in EXAMPLE.findall(DOC.read_text()):
        assert name not in found, f"two examples named {name}"
        found[name] = body
    return found


def _unknown_keys(example: Any, dumped: Any, where: str = "") -> list[str]:
    """Keys of ``example`` that the model's own dump does not have: a field the model ignores."""
    if isinstance(example, dict) and isinstance(dumped, dict):
        return [f"{where}.{k}" for k in example if k not in dumped] + [
            p for k in example if k in dumped for p in _unknown_keys(example[k], dumped[k], f"{where}.{k}")]
    if isinstance(example, list) and isinstance(dumped, list):
        return [p for i, (e, d) in enumerate(zip(example, dumped)) for p in _unknown_keys(e, d, f"{where}[{i}]")]
    return []


def _validates(model: type[BaseModel]) -> Callable[[str], None]:
    def check(body: str) -> None:
        example = json.loads(body)
        parsed = model.model_validate(example)
        assert _unknown_keys(example, parsed.model_dump(mode="json")) == []

    return check


def _flow_parameters(body: str) -> None:
    _validates(AlertEvent)(body)
    check_flow_parameters(**{k: v for k, v in json.loads(body).items()
                             if k in {"tenant", "cluster", "job_id", "incident_id", "alert_id", "evidence"}})
    names = json.loads(body)
    check_evidence_binding(names["evidence"], tenant=names["tenant"], cluster=names["cluster"], job_id=names["job_id"],
                           incident_id=names["incident_id"], roots=["s3://evidence"])


def _kernel_log(body: str) -> None:
    result = parse_telemetry_lines(body.splitlines())
    assert [(e.kind, e.code, e.host) for e in result.events] == [(SignalKind.XID, 79, "gpu-node-003")]
    assert result.rejected == 0


def _collector(body: str) -> None:
    result = parse_telemetry_lines(body.splitlines())
    assert [(e.kind, e.code, e.host) for e in result.events] == [(SignalKind.XID, 79, "gpu-node-003")]
    assert result.rejected == 0


def _signing_vector(body: str) -> None:
    vector = json.loads(body)
    assert sign(vector["secret"].encode(), vector["method"], vector["path"], vector["tenant"], vector["cluster"],
                vector["timestamp"], vector["nonce"], vector["body"].encode()) == vector["signature"]


def _signing_vector_v2(body: str) -> None:
    vector = json.loads(body)
    data = vector["body"].encode()
    assert (vector["content_length"], vector["content_sha256"]) == (len(data), body_sha256(data))
    assert sign_v2(vector["secret"].encode(), vector["method"], vector["path"], vector["tenant"], vector["cluster"],
                   vector["timestamp"], vector["nonce"], data) == vector["signature"]
    headers = signed_headers(secret=vector["secret"].encode(), key_id="dk_1", tenant=vector["tenant"],
                             cluster=vector["cluster"], method=vector["method"], path=vector["path"], body=data,
                             timestamp=vector["timestamp"], nonce=vector["nonce"])
    assert (headers["X-Denpex-Content-Length"], headers["X-Denpex-Content-SHA256"], headers["X-Denpex-Signature"]) == (
        str(vector["content_length"]), vector["content_sha256"], vector["signature"])


def _alertmanager(body: str) -> None:
    [alert] = parse_alertmanager(body.encode(), tenant="acme", cluster="lab", received_at=datetime.now(UTC))
    assert (alert.job_id, alert.incident_id, alert.rank, alert.world_size) == ("job-123", "inc-7", 0, 4)


def _page_record(body: str) -> None:
    """The approval page's record: the model, and the signature verifies with the doc's test key."""
    import base64

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

    from denpex.isolation.ed25519_keys import public_key_text
    from denpex.isolation.page_record import signature_verifies

    _validates(Approval)(body)
    record = Approval.model_validate_json(body)
    text = DOC.read_text()
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    assert f"`{public_key_text(key)}`" in text
    assert f"```\n{record.signed_bytes().decode()}\n```" in text  # the canonical form shown is the one signed
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_text(key)))
    assert signature_verifies(record, [public])
    assert not signature_verifies(record.model_copy(update={"decision": "reject"}), [public])


def _page_form(body: str) -> None:
    from denpex.approval_page.decide import PageAnswer

    _validates(PageAnswer)(body)


CHECKS: dict[str, Callable[[str], None]] = {
    "triage-report": _validates(TriageReport),
    "manifest": _validates(JobManifest),
    "kernel-log": _kernel_log,
    "collector-jsonl": _collector,
    "signing-vector": _signing_vector,
    "signing-vector-v2": _signing_vector_v2,
    "upload-identity": _validates(UploadIdentity),
    "registration": _validates(Registration),
    "denpex-alert": _validates(DenpexAlert),
    "alertmanager": _alertmanager,
    "flow-parameters": _flow_parameters,
    "approval": _validates(Approval),
    "approval-page-record": _page_record,
    "approval-page-form": _page_form,
}


def test_every_example_is_checked_and_every_check_has_its_example() -> None:
    text = DOC.read_text()
    assert set(_examples()) == set(CHECKS)
    # No JSON example escapes the checks: each fence of JSON follows a validate comment.
    assert len(re.findall(r"```jsonl?\n", text)) == sum(
        1 for _, fence, _ in EXAMPLE.findall(text) if fence in {"json", "jsonl"})


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_example_validates(name: str) -> None:
    CHECKS[name](_examples()[name])


def test_the_triage_example_keeps_the_contract_keys() -> None:
    example = json.loads(_examples()["triage-report"])
    assert {"verdict", "world_size", "ranks_with_evidence", "missing_ranks", "candidates", "plan"} <= example.keys()
    # Every key the command prints is documented (a new one lands here too).
    assert set(TriageReport.model_fields) == set(example)


def test_the_sections_are_there() -> None:
    text = DOC.read_text()
    assert [h for h in HEADINGS if f"\n{h}\n" not in text] == []


def test_nothing_points_at_a_document_users_do_not_have() -> None:
    pointing = [str(p.relative_to(ROOT)) for folder in ("denpex", "flows", "tasks", "blocks", "scripts")
                for p in (ROOT / folder).rglob("*.py") if "ARCHITECTURE.md" in p.read_text()]
    pointing += [name for name in ("README.md", "Makefile") if "ARCHITECTURE.md" in (ROOT / name).read_text()]
    assert pointing == []


def test_the_approval_pages_endpoints_are_the_apps() -> None:
    """Every endpoint the table names is a route of the page's app, and every route is in the table."""
    from denpex.approval_page.app import create_page_app

    section = DOC.read_text().split("### `denpex serve-approvals`", 1)[1]
    listed = set(re.findall(r"^\| `(GET|POST) (/[^`]*)` \|", section, re.M))
    source = inspect.getsource(create_page_app)
    routes = set(re.findall(r'@app\.(get|post)\("([^"]+)"\)', source))
    assert {(m.lower(), p) for m, p in listed} == routes
