"""Issue 30, §2: nothing is reserved for a request whose signature has not been checked.

Against the real ``denpex serve-api`` (the suite's S3 store and Prefect engine), with a small spool
so that nothing large is ever sent or written: ``--max-spool-bytes`` 48 MiB. Before issue 30 every
declared length was reserved at once, before the signature could be checked, and bodies not yet
verified could hold three quarters of the spool. The review's attacker knew two key ids (they
travel in every request's headers) but no secret: ten bodies declaring 3 GiB in all, trickled,
held that share, and a genuine tenant's alert, registration and upload got 503 for as long as the
attacker kept going. Here the same attack, scaled to the spool: bodies declaring 36 MiB, three
quarters of it, kept alive by one byte at a time (the minimum rate is set to 1 byte/s, so that
the attack lasts as long as the test needs, however slow the machine).
"""

from __future__ import annotations

import json
import select
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from denpex.ingest.client import IngestClient, encode_multipart
from denpex.ingest.registry import IssuedKey
from denpex.ingest.signing import sign, signed_headers
from testkit.services.ingest import ROOT
from testkit.services.s3 import MotoS3

from ingest.conftest import Engine, Lab, make_lab

pytestmark = [pytest.mark.timeout(240)]
KiB, MiB = 1 << 10, 1 << 20
FIXTURE = ROOT / "tests" / "fixtures" / "gloo" / "withheld_one"
SETTLE_S = 60.0  # generous: a loaded 2-core machine answers in well under a second
SPOOL = 48 * MiB
V1_ALLOWANCE = SPOOL // 16  # the default share of bodies not yet verified (v1): 1.5 MiB per key id
UNVERIFIED_BEFORE = SPOOL * 3 // 4  # what they could hold before issue 30


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, s3: MotoS3, engine: Engine) -> Iterator[Lab]:
    """The service with a 48 MiB spool and every share at its default fraction of it; a body may
    keep 1 byte/s (so a trickle holds its place) for the default 900 s."""
    tmp = tmp_path_factory.mktemp("reservations")
    lab = make_lab(tmp, s3, engine, prefix=tmp.name, extra_args=[
        "--max-spool-bytes", str(SPOOL), "--max-dump-bytes", str(4 * MiB), "--body-min-rate", "1"])
    yield lab
    lab.api.stop(signal.SIGTERM)


@dataclass
class HeldBody:
    """One attacker upload: its headers, then a byte now and then of a body that declares ``declared`` bytes."""

    port: int
    headers: dict[str, str]
    declared: int
    status: int | None = None
    sock: socket.socket | None = field(default=None, repr=False)

    def open(self) -> None:
        head = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
        self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        self.sock.sendall((f"POST /v1/evidence HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {self.declared}\r\n"
                           "Content-Type: multipart/form-data; boundary=x\r\n" + head + "\r\n-").encode())

    def trickle(self) -> None:
        """One more byte of the body, while the server has not answered."""
        if self.sock is not None and self.status is None:
            try:
                self.sock.sendall(b"-")
            except OSError:
                pass  # answered and closed meanwhile: read by answered()

    def answered(self) -> bool:
        """True once the server answered (or closed); the status is kept."""
        if self.status is not None:
            return True
        if self.sock is None or not select.select([self.sock], [], [], 0)[0]:
            return False
        try:
            answer = self.sock.recv(65536)
        except OSError:
            answer = b""
        self.status = int(answer.split()[1]) if answer.startswith(b"HTTP/1.1 ") else 0
        return True

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()


class Trickle:
    """The attacker's loop: a byte to every body still held, four times a second, until stopped."""

    def __init__(self, bodies: list[HeldBody]) -> None:
        self.bodies = bodies
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            for body in self.bodies:
                body.trickle()

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def _v1(key: IssuedKey, path: str, body: bytes, *, secret: bytes | None = None) -> dict[str, str]:
    """v1 headers, built by hand as an old client (or a stranger, with another ``secret``) builds them."""
    when, nonce = int(time.time()), uuid.uuid4().hex
    signature = sign(secret or key.secret.encode(), "POST", path, key.tenant, key.cluster, when, nonce, body)
    return {"X-Denpex-Tenant": key.tenant, "X-Denpex-Cluster": key.cluster, "X-Denpex-Key-Id": key.key_id,
            "X-Denpex-Timestamp": str(when), "X-Denpex-Nonce": nonce, "X-Denpex-Signature": signature}


def _forged(lab: Lab, key: IssuedKey, declared: int, *, version: str) -> HeldBody:
    """A request naming ``key`` (its own tenant and cluster, so the headers pass) signed without its secret."""
    headers = _v1(key, "/v1/evidence", b"anything", secret=b"guessed")
    if version == "v2":  # declaring the large body the attacker means to trickle
        headers |= {"X-Denpex-Content-Length": str(declared), "X-Denpex-Content-SHA256": "0" * 64,
                    "X-Denpex-Signature": "v2=" + headers["X-Denpex-Signature"][3:]}
    return HeldBody(lab.api.port, headers, declared)


def _spooled_bodies(spool: Path) -> int:
    return sum(1 for p in spool.iterdir() if p.suffix == ".body") if spool.exists() else 0


def _wait(condition: Callable[[], bool], what: str, sockets: Callable[[], list[socket.socket]] = list) -> None:
    """Until ``condition`` holds: woken by an answer on one of ``sockets``, or every 50 ms to look
    at the spool (a body admitted has a spool file and no answer yet)."""
    deadline = time.monotonic() + SETTLE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        select.select(sockets(), [], [], 0.05)


def _open_one_by_one(bodies: list[HeldBody], spool: Path) -> list[HeldBody]:
    """Open ``bodies`` one at a time, each answered or admitted (its spool file exists) before the
    next, so that they fill what they can to the byte; the ones the service holds."""
    for opened, body in enumerate(bodies, start=1):
        body.open()
        _wait(lambda: sum(b.answered() for b in bodies[:opened]) + _spooled_bodies(spool) >= opened,
              f"body {opened} to be answered or admitted",
              lambda: [b.sock for b in bodies[:opened] if b.sock is not None and b.status is None])
    return [b for b in bodies if not b.answered()]


def test_two_key_ids_without_a_secret_do_not_block_a_genuine_tenant(lab: Lab) -> None:
    spool = lab.api.state_dir / "spool"
    keys = [lab.foreign_key, lab.other_cluster_key]  # two key ids of others; no secret
    # Four bodies of 8 MiB and one of 4 MiB: the three quarters of the spool that unverified
    # bodies could hold before issue 30 (the review's nine of 321 MiB and one of 191 MiB, scaled).
    big = [8 * MiB] * 4 + [UNVERIFIED_BEFORE - 32 * MiB]
    attack = [_forged(lab, keys[i % 2], size, version="v1") for i, size in enumerate(big)]
    # Eight v1 bodies of 512 KiB, within what a v1 body may still be: they fill the allowance.
    attack += [_forged(lab, keys[i % 2], 512 * KiB, version="v1") for i in range(8)]
    # And forged v2 headers declaring 8 MiB.
    attack += [_forged(lab, key, 8 * MiB, version="v2") for key in keys]
    try:
        with Trickle(attack):
            held = _open_one_by_one(attack, spool)

            incident = "inc-" + uuid.uuid4().hex[:10]
            acme = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
            identity = {"job_id": "job-1", "incident_id": incident, "rank": 0, "world_size": 4,
                        "host": "gpu-node-001"}
            answers = {
                "upload": acme.upload(identity, (FIXTURE / "rank_0.pkl").read_bytes(), "rank_0.pkl"),
                "registration": acme.register("job-1", {"world_size": 4, "ranks": {"0": {"host": "gpu-node-001"}}}),
                "alert": acme.alert({"job_id": "job-1", "incident_id": incident, "rank": 0, "world_size": 4}),
                "bearer alert": httpx.post(f"{lab.url}/v1/alerts", headers={"Authorization": f"Bearer {lab.token.token}"},
                                           json={"version": "4", "status": "firing", "receiver": "denpex", "alerts": [{
                                               "status": "firing", "startsAt": "2026-12-01T13:09:14Z",
                                               "labels": {"alertname": "NCCLWatchdogTimeout", "job_id": "job-1",
                                                          "incident_id": incident}}]}),
            }
            still_held = [b for b in held if not b.answered()]  # the attack lasted through the genuine requests
        statuses = [(b.declared // KiB, b.status) for b in attack]
        print(f"attacker statuses by KiB declared: {statuses}; held {len(held)}, still held {len(still_held)}")
        assert {what: r.status_code for what, r in answers.items()} == {
            "upload": 201, "registration": 201, "alert": 200, "bearer alert": 200}, {
            what: r.text for what, r in answers.items()}
        # Forged v2 headers are refused from the headers alone: nothing was reserved for them.
        assert [b.status for b in attack[-2:]] == [401, 401], statuses
        # A v1 body larger than a key id's share of the allowance is refused before anything is
        # reserved; what the attacker holds at most is the allowance for v1 bodies.
        assert [b.status for b in attack[:5]] == [413] * 5, statuses
        assert 0 < len(held) * 512 * KiB <= V1_ALLOWANCE and still_held == held, statuses
        assert {b.status for b in attack[5:-2] if b not in held} == {503}, statuses
    finally:
        for body in attack:
            body.close()
    _wait(lambda: _spooled_bodies(spool) == 0, "the attacker's spool files to go with their requests")
    assert lab.s3.keys(f"{lab.prefix}/globex/") == [] and lab.s3.keys(f"{lab.prefix}/acme/c2/") == []


def _upload_body(incident: str, rank: int = 0) -> tuple[bytes, str]:
    identity = {"job_id": "job-1", "incident_id": incident, "rank": rank, "world_size": 4}
    return encode_multipart({"identity": json.dumps(identity)},
                            [("dump", f"rank_{rank}.pkl", (FIXTURE / f"rank_{rank}.pkl").read_bytes())])


def test_a_v1_client_keeps_working_within_the_allowance(lab: Lab) -> None:
    """A v1 sender's upload and registration still pass; a v1 body past its share of the allowance
    is refused at once (413) with the way out, before a byte is read."""
    incident = "inc-" + uuid.uuid4().hex[:10]
    body, content_type = _upload_body(incident)
    v1 = _v1(lab.key, "/v1/evidence", body)
    upload = httpx.post(f"{lab.url}/v1/evidence", content=body, headers=v1 | {"Content-Type": content_type})
    assert upload.status_code == 201, upload.text
    registration = json.dumps({"world_size": 4, "ranks": {"1": {"host": "gpu-node-002"}}}).encode()
    path = "/v1/jobs/job-v1/ranks"
    v1 = _v1(lab.key, path, registration)
    registered = httpx.post(f"{lab.url}{path}", content=registration, headers=v1 | {"Content-Type": "application/json"})
    assert registered.status_code == 201, registered.text
    too_big = HeldBody(lab.api.port, _v1(lab.key, "/v1/evidence", b""), V1_ALLOWANCE // 2 + 1)
    try:
        too_big.open()
        _wait(too_big.answered, "the answer to a v1 body past the allowance")
    finally:
        too_big.close()
    assert too_big.status == 413


def test_a_v2_body_other_than_the_signed_one_is_refused_and_nothing_is_stored(lab: Lab) -> None:
    incident = "inc-" + uuid.uuid4().hex[:10]
    body, content_type = _upload_body(incident)
    other, _ = _upload_body(incident, rank=1)
    other = other.replace(other.split(b"\r\n", 1)[0], body.split(b"\r\n", 1)[0])  # the same boundary

    def signed() -> dict[str, str]:
        return signed_headers(secret=lab.key.secret.encode(), key_id=lab.key.key_id, tenant="acme", cluster="c1",
                              method="POST", path="/v1/evidence", body=body) | {"Content-Type": content_type}

    swapped = httpx.post(f"{lab.url}/v1/evidence", content=other, headers=signed())
    assert swapped.status_code == 401 and "does not match its signed" in swapped.json()["error"], swapped.text
    cut = httpx.post(f"{lab.url}/v1/evidence", content=body[:-1], headers=signed())  # Content-Length is the sent one
    assert cut.status_code == 401 and "differs from the signed" in cut.json()["error"], cut.text
    chunked = httpx.post(f"{lab.url}/v1/evidence", content=iter([body, b"extra"]), headers=signed())
    assert chunked.status_code == 401 and "does not match its signed" in chunked.json()["error"], chunked.text
    assert lab.s3.keys(f"{lab.prefix}/acme/c1/job-1/{incident}/") == []
    assert httpx.post(f"{lab.url}/v1/evidence", content=body, headers=signed()).status_code == 201


def test_a_v2_get_signs_an_empty_body(lab: Lab) -> None:
    acme = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
    assert acme.job_ranks("job-never-registered").status_code == 404  # signed, verified, and then not found
    headers = signed_headers(secret=lab.key.secret.encode(), key_id=lab.key.key_id, tenant="acme", cluster="c1",
                             method="GET", path="/v1/jobs/job-1/ranks", body=b"x")
    refused = httpx.get(f"{lab.url}/v1/jobs/job-1/ranks", headers=headers)
    assert refused.status_code == 401 and "signs an empty body" in refused.json()["error"], refused.text


def test_a_tenant_with_many_keys_does_not_block_another_tenant(lab: Lab) -> None:
    """The red team's A10: a tenant that holds eight keys (its own secrets; one per job or node
    agent is ordinary) kept eight verified bodies per key arriving, all 64 of the service's slots,
    and every other tenant's signed upload got 503. Its keys together now hold a quarter of them."""
    spool = lab.api.state_dir / "spool"
    keys = [lab.registry.create_key("globex", "g1") for _ in range(8)]
    declared = 64 * KiB  # 4 MiB in all: the slots run out long before the tenant's bytes would

    def greedy(key: IssuedKey) -> HeldBody:
        headers = signed_headers(secret=key.secret.encode(), key_id=key.key_id, tenant=key.tenant,
                                 cluster=key.cluster, method="POST", path="/v1/evidence", body=b"-" * declared)
        return HeldBody(lab.api.port, headers, declared)

    attack = [greedy(key) for key in keys for _ in range(8)]
    try:
        with Trickle(attack):
            held = _open_one_by_one(attack, spool)
            incident = "inc-" + uuid.uuid4().hex[:10]
            acme = IngestClient(lab.url, key_id=lab.key.key_id, secret=lab.key.secret, tenant="acme", cluster="c1")
            upload = acme.upload({"job_id": "job-1", "incident_id": incident, "rank": 0, "world_size": 4,
                                  "host": "gpu-node-001"}, (FIXTURE / "rank_0.pkl").read_bytes(), "rank_0.pkl")
            registration = acme.register("job-" + incident, {"world_size": 4, "ranks": {"0": {"host": "gpu-node-001"}}})
            still_held = [b for b in held if not b.answered()]
        statuses = sorted({b.status for b in attack if b not in held})
        print(f"greedy tenant: {len(held)} of {len(attack)} bodies held, the rest answered {statuses}")
        assert (upload.status_code, registration.status_code) == (201, 201), (upload.text, registration.text)
        assert len(held) == 16 and still_held == held and statuses == [503], statuses
    finally:
        for body in attack:
            body.close()
    _wait(lambda: _spooled_bodies(spool) == 0, "the greedy tenant's spool files to go with their requests")
