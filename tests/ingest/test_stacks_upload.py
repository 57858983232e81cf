"""Stacks files through ``POST /v1/evidence`` (issue 19, item 3), against the real HTTP service and moto S3.

The stacks are real: :func:`capture_stacks` of this test process (what the collector writes at a
dump) and :func:`parse_pyspy_dump` of py-spy's JSON shape. They land where
:func:`read_stack_evidence` finds them, versioned with their dump, idempotent; hostile parts are
refused with one sentence and leave nothing behind.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from denpex.collector.stacks import capture_stacks
from denpex.evidence.stacks import MAX_BYTES, MAX_FRAMES, MAX_THREADS, StackSource, parse_pyspy_dump, read_stack_evidence
from denpex.evidence.store import open_store
from denpex.ingest.client import IngestClient, encode_multipart
from denpex.ingest.registry import IssuedKey
from ingest.conftest import Lab, make_lab
from testkit.services.ingest import ROOT
from testkit.services.s3 import MotoS3

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
FIXTURE = ROOT / "tests" / "fixtures" / "gloo" / "withheld_one"
TAKEN = datetime(2026, 12, 1, 13, 9, 14, tzinfo=UTC)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, s3: MotoS3) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("ingest-stacks")
    lab = make_lab(tmp, s3, None, prefix=f"stacks-{uuid.uuid4().hex[:6]}")
    yield lab
    lab.api.stop(signal.SIGTERM)


def client(lab: Lab, key: IssuedKey | None = None) -> IngestClient:
    key = key or lab.key
    return IngestClient(lab.url, key_id=key.key_id, secret=key.secret, tenant=key.tenant, cluster=key.cluster)


def identity(rank: int, incident: str, **extra: Any) -> dict[str, Any]:
    return {"job_id": "job-1", "incident_id": incident, "rank": rank, "world_size": 4,
            "host": f"gpu-node-00{rank + 1}", "dumped_at": "2026-12-01T13:09:14+00:00", **extra}


def dump(rank: int, ext: str = ".pkl") -> bytes:
    return (FIXTURE / f"rank_{rank}{ext}").read_bytes()


def stacks(rank: int) -> bytes:
    return capture_stacks(rank, taken_at=TAKEN).model_dump_json().encode()


def pyspy(rank: int) -> bytes:
    printed = [{"pid": 4242, "thread_id": 140, "thread_name": "MainThread", "os_thread_id": 4242, "active": True,
                "owns_gil": True, "frames": [
                    {"name": "match", "filename": "/usr/lib/python3.11/re/__init__.py", "line": 166},
                    {"name": "wedge_in_regex", "filename": "/job/wedge.py", "line": 5}]}]
    return parse_pyspy_dump(json.dumps(printed).encode(), rank=rank, taken_at=TAKEN, pid=4242).model_dump_json().encode()


def base(lab: Lab, incident: str) -> str:
    return f"{lab.prefix}/acme/c1/job-1/{incident}"


def objects(lab: Lab, incident: str) -> set[str]:
    prefix = base(lab, incident) + "/"
    return {k.removeprefix(prefix) for k in lab.s3.keys(prefix)}


def refused(response: httpx.Response, status: int, words: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert words in error, error
    return str(error)


def test_stacks_land_where_triage_reads_them_versioned_and_idempotent(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    incident = new = "inc-" + uuid.uuid4().hex[:10]
    c = client(lab)
    first = c.upload(identity(2, new), dump(2), "rank_2.pkl", stacks=stacks(2), stacks_pyspy=pyspy(2))
    assert first.status_code == 201 and first.json()["stacks_stored"] == 2, first.text
    for rank in (0, 1):
        assert c.upload(identity(rank, new), dump(rank), f"rank_{rank}.pkl", stacks=stacks(rank)).status_code == 201
    held = objects(lab, incident)
    assert {"collector/rank_2.stacks.json", "collector/rank_2.py-spy.stacks.json", "versions/rank_2/v1.stacks.json",
            "versions/rank_2/v1.py-spy.stacks.json", "collector/rank_0.stacks.json"} <= held
    # The reader triage uses finds them in the S3 store, as sent.
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "DENPEX_S3_ENDPOINT_URL": lab.s3.endpoint}.items():
        monkeypatch.setenv(name, value)
    evidence = read_stack_evidence(open_store(f"s3://{lab.s3.bucket}/{base(lab, incident)}"), at=None)
    assert evidence.refused == {}
    by_key = {(r.rank, r.source): r for r in evidence.records}
    assert set(by_key) == {(0, StackSource.COLLECTOR), (1, StackSource.COLLECTOR), (2, StackSource.COLLECTOR),
                           (2, StackSource.PY_SPY)}
    main = by_key[(2, StackSource.COLLECTOR)].thread("MainThread")
    assert main is not None and any(f.function == "stacks" for f in main.frames)  # this very test's helper
    assert by_key[(2, StackSource.PY_SPY)].threads[0].frames[1].function == "wedge_in_regex"

    # The same bytes again: nothing new stored.
    again = c.upload(identity(2, new), dump(2), "rank_2.pkl", stacks=stacks_of(lab, incident, 2),
                     stacks_pyspy=pyspy(2))
    assert again.status_code == 200 and again.json()["stored"] is False and again.json()["stacks_stored"] == 0
    # The JSON of the same dump joins version 1 and brings the same stacks: nothing new either.
    joined = c.upload(identity(2, new), dump(2, ".json"), "rank_2.json", stacks=stacks_of(lab, incident, 2))
    assert joined.json()["version"] == 1 and joined.json()["stacks_stored"] == 0, joined.text
    # Other stacks for a dump that has them: refused, nothing changed.
    other = refused(c.upload(identity(2, new), dump(2), "rank_2.pkl", stacks=stacks(2)), 409, "taken once")
    assert other.count(".") <= 2
    assert lab.s3.read(f"{base(lab, incident)}/collector/rank_2.stacks.json") == stacks_of(lab, incident, 2)

    # A new dump version without stacks: the old stacks leave collector/ (never beside a new dump),
    # the version's own objects stay.
    later = c.upload(identity(2, new, dumped_at="2026-12-01T13:10:00+00:00"), dump(3), "rank_2.pkl")
    assert later.json()["version"] == 2 and later.json()["stacks_stored"] == 0
    held = objects(lab, incident)
    assert "collector/rank_2.stacks.json" not in held and "collector/rank_2.py-spy.stacks.json" not in held
    assert {"versions/rank_2/v1.stacks.json", "versions/rank_2/v1.py-spy.stacks.json"} <= held
    # An identical re-upload of version 2 that now brings stacks: stored for version 2, current again.
    filled = c.upload(identity(2, new, dumped_at="2026-12-01T13:10:00+00:00"), dump(3), "rank_2.pkl",
                      stacks=stacks(2))
    assert filled.status_code == 200 and filled.json()["stored"] is False and filled.json()["stacks_stored"] == 1
    held = objects(lab, incident)
    assert {"versions/rank_2/v2.stacks.json", "collector/rank_2.stacks.json"} <= held
    assert "collector/rank_2.py-spy.stacks.json" not in held
    # Re-sending version 1's dump with stacks (it has them) changes nothing current.
    assert lab.s3.read(f"{base(lab, incident)}/collector/rank_2.stacks.json") == \
        lab.s3.read(f"{base(lab, incident)}/versions/rank_2/v2.stacks.json")


def stacks_of(lab: Lab, incident: str, rank: int) -> bytes:
    return lab.s3.read(f"{base(lab, incident)}/versions/rank_{rank}/v1.stacks.json")


def _many_threads() -> bytes:
    threads = [{"name": f"t{i}", "frames": []} for i in range(MAX_THREADS + 1)]
    return json.dumps({"rank": 0, "source": "collector", "threads": threads}).encode()


def _deep_frames() -> bytes:
    frames = [{"file": "/job/train.py", "line": i, "function": "step"} for i in range(MAX_FRAMES + 1)]
    return json.dumps({"rank": 0, "source": "collector", "threads": [{"name": "MainThread", "frames": frames}]}).encode()


def _record(**fields: Any) -> bytes:
    return json.dumps({"rank": 0, "source": "collector", **fields}).encode()


HOSTILE = {
    "not JSON": (b"{nope", "not valid JSON"),
    "a list": (b"[1, 2]", "holds a list"),
    "wrong types": (_record(threads=[{"name": "MainThread", "frames": [{"file": "a.py", "line": "88",
                                                                        "function": "f"}]}]), "line"),
    "unknown field": (_record(locals={"password": "x"}), "locals"),
    "deeply nested": (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
    "too many threads": (_many_threads(), "over the stacks bounds"),
    "too many frames": (_deep_frames(), "over the stacks bounds"),
    "a long string": (_record(threads=[{"name": "x" * 600, "frames": []}]), "over the stacks bounds"),
    "markdown and control characters": (_record(threads=[{"name": "## pwned\n| a | b |\x1b[31m", "frames": []}]),
                                        "over the stacks bounds"),
    "another rank": (json.dumps({"rank": 3, "source": "collector"}).encode(), "names rank 3"),
    "another source": (json.dumps({"rank": 0, "source": "py-spy"}).encode(), "source 'py-spy'"),
    # Another reader of the stored bytes may take the first key where this service takes the last.
    "a key named twice": (b'{"rank": 3, "source": "py-spy", "rank": 0, "source": "collector"}', "'rank', 'source' twice"),
    "empty": (b"", "is empty"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_stacks_part_is_refused_with_its_reason_and_nothing_is_stored(lab: Lab, case: str) -> None:
    data, words = HOSTILE[case]
    incident = "inc-" + uuid.uuid4().hex[:10]
    error = refused(client(lab).upload(identity(0, incident), dump(0), "rank_0.pkl", stacks=data), 422, words)
    assert "\n" not in error and len(error) < 600
    assert objects(lab, incident) == set()  # the dump is refused with its stacks: nothing half-stored


def test_stacks_parts_are_bounded_single_and_need_their_dump(lab: Lab) -> None:
    incident = "inc-" + uuid.uuid4().hex[:10]
    c = client(lab)
    over = b'{"rank": 0, "source": "collector", "notes": ["' + b"x" * MAX_BYTES + b'"]}'
    refused(c.upload(identity(0, incident), dump(0), "rank_0.pkl", stacks=over), 413, "cap")
    body, content_type = encode_multipart({"identity": json.dumps(identity(0, incident))},
                                          [("dump", "rank_0.pkl", dump(0)), ("stacks", "a", stacks(0)),
                                           ("stacks", "b", stacks(0))])
    refused(c.send("POST", "/v1/evidence", body, content_type=content_type), 422, "at most one part 'stacks'")
    body, content_type = encode_multipart({"identity": json.dumps(identity(0, incident))}, [("stacks", "a", stacks(0))])
    refused(c.send("POST", "/v1/evidence", body, content_type=content_type), 422, "comes with its rank's 'dump'")
    # The py-spy part takes py-spy's records only.
    refused(c.upload(identity(0, incident), dump(0), "rank_0.pkl", stacks_pyspy=stacks(0)), 422,
            "takes source 'py-spy' only")
    assert objects(lab, incident) == set()


def test_a_host_bound_key_sends_stacks_of_its_own_hosts_ranks_only(lab: Lab) -> None:
    """lab.node_key is bound to gpu-node-002 (rank 1 here); tenant and cluster bind as for dumps."""
    incident = "inc-" + uuid.uuid4().hex[:10]
    agent = client(lab, lab.node_key)
    refused(agent.upload(identity(2, incident), dump(2), "rank_2.pkl", stacks=stacks(2)), 403,
            "bound to host 'gpu-node-002'")
    assert agent.upload(identity(1, incident), dump(1), "rank_1.pkl", stacks=stacks(1)).status_code == 201
    assert "collector/rank_1.stacks.json" in objects(lab, incident)
    # A rank the job's key uploaded without a host: nothing shows it ran on the agent's host, so the
    # agent may neither add stacks to its version nor replace it (once, the first sender kept the slot).
    bare = {k: v for k, v in identity(3, incident).items() if k != "host"}
    assert client(lab).upload(bare, dump(3), "rank_3.pkl").status_code == 201
    refused(agent.upload(bare, dump(3), "rank_3.pkl", stacks=stacks(3)), 403, "uploaded without a host")
    refused(agent.upload(bare, dump(1), "rank_3.pkl", stacks=stacks(3)), 403, "uploaded without a host")
    assert "collector/rank_3.stacks.json" not in objects(lab, incident)
    # Another cluster's key cannot add stacks to this incident: its uploads land in its own cluster.
    other = client(lab, lab.other_cluster_key).upload(identity(2, incident), dump(2), "rank_2.pkl", stacks=stacks(2))
    assert other.status_code == 201
    assert "collector/rank_2.stacks.json" not in objects(lab, incident)
    assert f"{lab.prefix}/acme/c2/job-1/{incident}/collector/rank_2.stacks.json" in lab.s3.keys(
        f"{lab.prefix}/acme/c2/job-1/{incident}/")


def test_the_total_body_cap_counts_both_stacks_parts(lab: Lab, tmp_path: Path) -> None:
    """A dump at the cap and two stacks files at theirs still fit the body's cap (the config's sum)."""
    from denpex.ingest.service import ServiceConfig

    config = ServiceConfig(state_dir=tmp_path, store="file:///x")
    assert config.max_upload_bytes >= config.max_dump_bytes + config.max_telemetry_bytes + 2 * MAX_BYTES


def test_the_uploader_sends_the_ranks_stacks_files_beside_each_dump(lab: Lab, tmp_path: Path) -> None:
    """The collector's and the sidecar's files go with rank 2's dump (pickle and JSON, one version);
    rank 3's file names another rank: its dump goes without it (a stacks file never costs a dump)."""
    from denpex.collector import Backoff, DumpRecord, DumpRequest, DumpTrigger, EvidenceUploader, UploadTarget
    from denpex.collector.layout import stacks_path
    from denpex.collector.uploader import incident_id_for

    dumps = tmp_path / "dumps"
    (dumps / "collector").mkdir(parents=True)
    for name in ("rank_2.pkl", "rank_2.json", "rank_3.pkl"):
        (dumps / name).write_bytes((FIXTURE / name).read_bytes())
    stacks_path(dumps, 2).write_bytes(stacks(2))
    stacks_path(dumps, 2, StackSource.PY_SPY).write_bytes(pyspy(2))
    stacks_path(dumps, 3).write_bytes(stacks(1))  # names rank 1
    job = "job-1"
    target = UploadTarget(url=lab.url, key_id=lab.key.key_id, secret=lab.key.secret,  # type: ignore[arg-type]
                          tenant="acme", cluster="c1", job_id=job)
    uploader = EvidenceUploader(target, dump_dir=dumps, spool_dir=tmp_path / "spool", attach_nvml=False,
                                identity={"world_size": 4}, backoff=Backoff(first_s=0.1, max_s=0.5))
    now = datetime.now(UTC)
    request = DumpRequest(requested_by="rank 2", reason="test", requested_at=now)
    for rank, files in ((2, ["rank_2.pkl", "rank_2.json"]), (3, ["rank_3.pkl"])):
        record = DumpRecord(rank=rank, host=f"gpu-node-00{rank + 1}", pid=1, dumped_at=now, trigger=DumpTrigger.STALL,
                            reason="test", files=files, dump_seconds=0.0)
        uploader.submit(record, request)
    assert uploader.spool.pending() == [] and uploader.spool.rejected() == [] and uploader.delivered == 3
    incident = incident_id_for(request)
    held = objects(lab, incident)
    assert {"rank_2.pkl", "rank_2.json", "rank_3.pkl", "versions/rank_2/v1.stacks.json",
            "versions/rank_2/v1.py-spy.stacks.json"} <= held, sorted(held)
    assert lab.s3.read(f"{base(lab, incident)}/collector/rank_2.stacks.json") == stacks_path(dumps, 2).read_bytes()
    assert lab.s3.read(f"{base(lab, incident)}/collector/rank_2.py-spy.stacks.json") == pyspy(2)
    assert "collector/rank_3.stacks.json" not in held


def test_the_contract_docs_stacks_examples_pass_the_services_check() -> None:
    """docs/contracts.md's multipart example of the stacks parts is what the service takes."""
    import re

    from denpex.ingest.stacks_check import check_stacks_part

    doc = (ROOT / "docs" / "contracts.md").read_text()
    section = doc[doc.index("### Stacks parts"):doc.index("## Alert event")]
    bodies = re.findall(r'name="(stacks(?:_pyspy)?)"; filename="[^"]+"\n\n(\{.*?\})\n--b', section, re.S)
    assert [name for name, _ in bodies] == ["stacks", "stacks_pyspy"]
    for (name, body), source in zip(bodies, (StackSource.COLLECTOR, StackSource.PY_SPY), strict=True):
        assert check_stacks_part(body.encode(), source, 2).source is source, name


def test_a_part_of_one_key_repeated_is_refused_in_linear_time() -> None:
    """Review: naming the repeated keys counted each key's copies by ``list.count``, quadratic in
    the keys: 3.6 MB of ``"a":1`` (600,000 copies) would have held the request's worker for hours."""
    import time

    from denpex.ingest.errors import InvalidRequestError
    from denpex.ingest.stacks_check import _no_repeated_keys, check_stacks_part

    data = b"{" + b",".join(b'"a":1' for _ in range(600_000)) + b"}"
    assert len(data) <= MAX_BYTES
    started = time.process_time()
    with pytest.raises(InvalidRequestError, match="names 'a' twice"):
        _no_repeated_keys(data, "stacks")  # the check itself, which the service runs on valid records
    with pytest.raises(InvalidRequestError):  # the service refuses it before that (not a record)
        check_stacks_part(data, StackSource.COLLECTOR, 0)
    assert time.process_time() - started < 10
