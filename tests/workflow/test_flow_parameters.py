"""Flow parameters are checked with the ingest service's rules, and paths built from them stay in
the state directory (issue 16, finding 13)."""

from __future__ import annotations

from pathlib import Path

import pytest

from denpex.state_paths import StatePathError, state_path
from denpex.workflow.flow_parameters import (
    FlowParameterError,
    check_evidence_binding,
    check_flow_parameters,
    evidence_roots,
)

GOOD = dict(tenant="acme", cluster="gpu.prod", job_id="job-123", incident_id="fr-20261201T130914Z",
            alert_id="am-7f3a", evidence="s3://evidence/acme/gpu.prod/job-123/fr-20261201T130914Z")


def test_the_ingest_services_names_and_ids_pass() -> None:
    check_flow_parameters(**GOOD)
    check_flow_parameters(evidence="/srv/evidence/acme/c1/job/inc")
    check_flow_parameters(evidence="file:///srv/evidence/inc")


@pytest.mark.parametrize("field, value, why", [
    ("tenant", "../etc", "tenant '../etc' is not a valid name"),
    ("cluster", "gpu prod", "cluster 'gpu prod' is not a valid name"),
    ("cluster", "a/b", "cluster 'a/b' is not a valid name"),
    ("job_id", "job/../../x", "job_id 'job/../../x' must match"),
    ("incident_id", "../../../x", "incident_id '../../../x' must match"),
    ("incident_id", "x" * 64, "must match"),
    ("alert_id", "am 1", "alert_id 'am 1' must match"),
    ("evidence", "s3://evidence/acme/../globex/job/inc", "climbs with '..'"),
    ("evidence", "/srv/evidence/../../etc", "climbs with '..'"),
    ("evidence", "s3:///prefix", "names no bucket"),
    ("evidence", "http://example.com/x", "neither a folder nor an s3:// URI"),
    ("evidence", "/srv/x\n", "control character"),
], ids=lambda v: str(v)[:24])
def test_a_bad_parameter_is_named(field: str, value: str, why: str) -> None:
    with pytest.raises(FlowParameterError, match="invalid flow parameters") as caught:
        check_flow_parameters(**{**GOOD, field: value})
    assert why in str(caught.value) and str(caught.value).endswith("nothing was done")


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(FlowParameterError) as caught:
        check_flow_parameters(tenant="", cluster="a/b", incident_id="..")
    assert str(caught.value).count(";") == 3


def test_state_paths_stay_in_the_state_directory(tmp_path: Path) -> None:
    assert state_path(tmp_path, "plans", "inc-7.json") == tmp_path / "plans" / "inc-7.json"
    for parts in [("plans", "../../x.json"), ("..", "x"), ("plans", ""), ("plans", "."), ("a\0b",), ()]:
        with pytest.raises(StatePathError):
            state_path(tmp_path, *parts)


BOUND = dict(tenant="acme", cluster="gpu.prod", job_id="job-123", incident_id="fr-20261201T130914Z")
INCIDENT = "acme/gpu.prod/job-123/fr-20261201T130914Z"


@pytest.mark.parametrize("evidence, roots, read", [
    (f"s3://evidence/{INCIDENT}", ["s3://evidence"], f"s3://evidence/{INCIDENT}"),
    (f"s3://evidence/ingest/{INCIDENT}/", ["s3://evidence/ingest/"], f"s3://evidence/ingest/{INCIDENT}"),
    (f"/srv/evidence/{INCIDENT}", ["file:///srv/evidence"], f"/srv/evidence/{INCIDENT}"),
    (f"file:///srv//evidence/./{INCIDENT}/", ["/srv/evidence"], f"/srv/evidence/{INCIDENT}"),
    (f"s3://b2/{INCIDENT}", ["s3://evidence", "s3://b2"], f"s3://b2/{INCIDENT}"),  # two services, one worker
    # Nested roots: each root's own incidents are bound.
    (f"s3://evidence/ingest/{INCIDENT}", ["s3://evidence", "s3://evidence/ingest"], f"s3://evidence/ingest/{INCIDENT}"),
    (f"s3://evidence/{INCIDENT}", ["s3://evidence/ingest", "s3://evidence"], f"s3://evidence/{INCIDENT}"),
])
def test_the_incidents_own_folder_is_bound_and_read_as_checked(evidence: str, roots: list[str], read: str) -> None:
    assert check_evidence_binding(evidence, roots=roots, **BOUND) == read


@pytest.mark.parametrize("evidence, roots, why", [
    # Another tenant's upload in the same store, shown to acme's approver as acme's incident.
    ("s3://evidence/globex/g1/job-9/inc-1", ["s3://evidence"], f"stores it at '{INCIDENT}' under one of"),
    # The right tail in a bucket or folder that is not the ingest service's.
    (f"s3://forged/{INCIDENT}", ["s3://evidence"], "DENPEX_EVIDENCE_ROOT"),
    ("s3://acme/gpu.prod/job-123/fr-20261201T130914Z", ["s3://evidence"], "is not incident"),
    (f"/tmp/x/{INCIDENT}", ["/srv/evidence"], "is not incident"),
    # S3 keys are literal: these name other objects than the incident's, whatever they look like.
    ("s3://evidence/acme//gpu.prod/job-123/fr-20261201T130914Z", ["s3://evidence"], "is not incident"),
    (f"s3://evidence/./{INCIDENT}", ["s3://evidence"], "is not incident"),
    (f"s3://evidence//{INCIDENT}", ["s3://evidence"], "is not incident"),
    (f"s3://evidence/{INCIDENT}/.", ["s3://evidence"], "is not incident"),
    (f"s3://Evidence/{INCIDENT}", ["s3://evidence"], "is not incident"),
    # Another incident, or another job, of the same tenant and cluster.
    ("s3://evidence/acme/gpu.prod/job-123/fr-other", ["s3://evidence"], "is not incident"),
    ("/srv/evidence", ["/srv/evidence"], "is not incident"),
])
def test_any_other_folder_is_refused(evidence: str, roots: list[str], why: str) -> None:
    with pytest.raises(FlowParameterError, match="is not incident fr-20261201T130914Z's folder") as caught:
        check_evidence_binding(evidence, roots=roots, **BOUND)
    assert why in str(caught.value) and str(caught.value).endswith("nothing was done")
    # The worker's roots are not told to whoever started the run (its state message is public).
    assert not [r for r in roots if r.rstrip("/") in str(caught.value).replace(evidence, "")]


@pytest.mark.parametrize("roots, why", [
    ([], "DENPEX_EVIDENCE_ROOT is not set on this worker"),  # unset or blank: nothing is read
    (["evidence"], "is a relative folder"),
    (["/srv/../etc"], "climbs"),
    (["s3://"], "names no bucket"),
    (["/"], "the whole file system"),
    (["file:///srv/.."], "climbs"),
    (["http://example.com"], "neither a folder nor an s3:// URI"),
])
def test_without_a_usable_root_nothing_is_read(roots: list[str], why: str) -> None:
    with pytest.raises(FlowParameterError, match=why):
        check_evidence_binding(f"/srv/evidence/{INCIDENT}", roots=roots, **BOUND)


@pytest.mark.parametrize("environ, roots", [
    ({}, []),
    ({"DENPEX_EVIDENCE_ROOT": "  \t "}, []),
    ({"DENPEX_EVIDENCE_ROOT": "s3://evidence"}, ["s3://evidence"]),
    ({"DENPEX_EVIDENCE_ROOT": " s3://evidence\n/srv/ingest  s3://b/p "}, ["s3://evidence", "/srv/ingest", "s3://b/p"]),
])
def test_the_worker_setting_names_roots_separated_by_whitespace(environ: dict[str, str], roots: list[str]) -> None:
    assert evidence_roots(environ) == roots


def test_nested_roots_bind_no_folder_of_the_inner_roots_tenants() -> None:
    """Attacker review: with roots ``s3://evidence`` and ``s3://evidence/ingest``, a run for tenant
    ``ingest`` bound, under the outer root, a job folder of the inner service's tenant acme."""
    names = dict(tenant="ingest", cluster="acme", job_id="gpu.prod", incident_id="job-123")
    with pytest.raises(FlowParameterError, match="is not incident job-123's folder"):
        check_evidence_binding("s3://evidence/ingest/acme/gpu.prod/job-123",
                               roots=["s3://evidence", "s3://evidence/ingest"], **names)
    # With the outer root alone it is that tenant's incident, as the layout says.
    assert check_evidence_binding("s3://evidence/ingest/acme/gpu.prod/job-123", roots=["s3://evidence"],
                                  **names) == "s3://evidence/ingest/acme/gpu.prod/job-123"


@pytest.mark.parametrize("evidence", [
    "/srv/evidence/acme/gpu.prod/job-123/x/../fr-20261201T130914Z",
    f"/srv/evidence/{INCIDENT}/../../../../../evidence/{INCIDENT}",
])
def test_the_binding_refuses_a_climb_on_its_own(evidence: str) -> None:
    """Attacker review: called without check_flow_parameters first, a '..' was folded away."""
    with pytest.raises(FlowParameterError, match="climbs"):
        check_evidence_binding(evidence, roots=["/srv/evidence"], **BOUND)
