"""Issue 16, finding 3: a stranger cannot make ``denpex serve-api`` hold bodies in memory.

Against the real server on loopback (a local evidence folder, no flow engine): the headers are
checked before any body byte is read (a v2 signature is verified from them, issue 30), bodies
stream to a bounded spool while they are hashed, a body that takes too long is cut off (408), and
a nonce is spent only by a request whose signature verified. Memory is the whole process tree's
PSS (the server, its forkserver and the dump-checking workers), read from ``/proc``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import select
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from denpex.ingest.client import IngestClient, encode_multipart
from denpex.ingest.plans import PlanTier
from denpex.ingest.registry import IssuedKey, Registry
from denpex.ingest.signing import DeclaredBody, SignatureVersion, canonical_string_v2, signed_headers
from testkit.services.ingest import ROOT, ApiServer, process_tree_pss

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
FIXTURE = ROOT / "tests" / "fixtures" / "gloo" / "withheld_one"
MiB = 1 << 20
ATTACK_BODY = 256 * MiB
V1_BODY = 32 * MiB  # a v1 body is taken within the allowance only
SPOOL_BOUND = 900 * MiB
V1_ALLOWANCE = 128 * MiB  # 64 MiB per key id: two forged 32 MiB v1 bodies of one key id at a time
BODY_DEADLINE_S = 6
MEMORY_ALLOWANCE = 100 * MiB


@dataclass
class LocalLab:
    api: ApiServer
    key: IssuedKey
    store: Path
    spool: Path

    def client(self) -> IngestClient:
        return IngestClient(self.api.url, key_id=self.key.key_id, secret=self.key.secret, tenant="acme", cluster="c1")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLab]:
    tmp = tmp_path_factory.mktemp("preauth")
    registry = Registry(tmp / "state")
    registry.add_tenant("acme", PlanTier.DATA_CENTER)
    key = registry.create_key("acme", "c1")
    api = ApiServer(tmp / "state", str(tmp / "evidence"), s3_endpoint=None, prefect_api_url=None, log_dir=tmp,
                    extra_args=["--spool-dir", str(tmp / "spool"), "--max-spool-bytes", str(SPOOL_BOUND),
                                "--max-unverified-bytes", str(V1_ALLOWANCE),
                                "--max-bodies-in-flight", "8", "--max-body-seconds", str(BODY_DEADLINE_S)])
    api.start()
    yield LocalLab(api=api, key=key, store=tmp / "evidence", spool=tmp / "spool")
    api.stop(signal.SIGTERM)


def identity(rank: int, incident: str) -> dict[str, Any]:
    return {"job_id": "job-1", "incident_id": incident, "rank": rank, "world_size": 4,
            "dumped_at": "2026-12-01T13:09:14+00:00"}


def genuine_upload(lab: LocalLab, rank: int = 0) -> httpx.Response:
    return lab.client().upload(identity(rank, "inc-" + uuid.uuid4().hex[:10]),
                               (FIXTURE / f"rank_{rank}.pkl").read_bytes(), f"rank_{rank}.pkl")


def spool_bytes(spool: Path) -> int:
    total = 0
    for path in spool.iterdir():
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            continue
    return total


def slow_body(port: int, headers: dict[str, str], *, size: int, pause_s: float = 0.03) -> int | None:
    """Send a ``size``-byte upload in 1 MiB chunks, never its last byte; the status the server answered."""
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.sendall((f"POST /v1/evidence HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {size}\r\n"
                      "Content-Type: multipart/form-data; boundary=x\r\n" + head + "\r\n").encode())
        chunk = b"\0" * MiB
        sent = 0
        answer = b""
        started = time.monotonic()
        while time.monotonic() - started < BODY_DEADLINE_S + 20:
            if select.select([sock], [], [], 0)[0]:
                answer = sock.recv(65536)  # answered (or closed): stop sending
                break
            if sent < size - 1:
                n = min(MiB, size - 1 - sent)
                try:
                    sock.sendall(chunk[:n])
                except OSError:
                    pass  # the server stopped reading; its answer is what counts
                sent += n
                time.sleep(pause_s)
            else:
                time.sleep(0.05)  # hold the last byte
        return int(answer.split()[1]) if answer.startswith(b"HTTP/1.1 ") else None
    except OSError:
        return None
    finally:
        sock.close()


def attack_headers(lab: LocalLab, *, known: bool, version: SignatureVersion = SignatureVersion.V2) -> dict[str, str]:
    # A known key id (not a secret) with a signature made by a secret that is not its own.
    return signed_headers(secret=b"guessed", key_id=lab.key.key_id if known else "dk_0123456789abcdef",
                          tenant="acme", cluster="c1", method="POST", path="/v1/evidence", body=b"whatever",
                          version=version)


def test_slow_unsigned_and_forged_bodies_hold_no_memory(lab: LocalLab) -> None:
    """8 slow 256 MiB bodies with an unknown key, 8 with a known key and a forged v2 signature, and
    8 slow v1 bodies (within the v1 allowance) with a known key and a bad signature."""
    assert genuine_upload(lab).status_code == 201  # the dump-checking worker is up: that is idle
    time.sleep(1)
    idle = max(process_tree_pss(lab.api.pid) for _ in range(3))
    statuses: dict[str, list[int | None]] = {"unknown": [], "forged": [], "forged v1": []}
    peak = {"memory": idle, "spool": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak["memory"] = max(peak["memory"], process_tree_pss(lab.api.pid))
            peak["spool"] = max(peak["spool"], spool_bytes(lab.spool))
            time.sleep(0.1)

    def attacker(kind: str) -> None:
        version = SignatureVersion.V1 if kind == "forged v1" else SignatureVersion.V2
        headers = attack_headers(lab, known=kind != "unknown", version=version)
        statuses[kind].append(slow_body(lab.api.port, headers, size=V1_BODY if kind == "forged v1" else ATTACK_BODY))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    threads = [threading.Thread(target=attacker, args=(kind,)) for kind in statuses for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(2)
    during = genuine_upload(lab, 1)
    for thread in threads:
        thread.join(60)
    stop.set()
    sampler.join()
    after = genuine_upload(lab, 3)

    print(f"idle {idle / MiB:.0f} MiB, peak {peak['memory'] / MiB:.0f} MiB "
          f"(+{(peak['memory'] - idle) / MiB:.0f} MiB), spool peak {peak['spool'] / MiB:.0f} MiB, "
          f"statuses {statuses}")
    # Answered from the headers, at once: an unknown key, and a v2 signature that does not verify.
    assert statuses["unknown"] == [401] * 8, statuses
    assert statuses["forged"] == [401] * 8, statuses
    forged = statuses["forged v1"]
    # Two fit the key id's share of the v1 allowance and were cut off at the deadline; the rest
    # were refused at once.
    assert set(forged) <= {408, 503}, forged
    assert 1 <= forged.count(408) <= (V1_ALLOWANCE // 2) // V1_BODY, forged
    assert peak["memory"] - idle <= MEMORY_ALLOWANCE, (idle, peak)
    assert 0 < peak["spool"] <= V1_ALLOWANCE + 2 * MiB, peak  # the v1 allowance, and the genuine uploads
    assert during.status_code == 201, during.text
    assert after.status_code == 201, after.text
    assert list(lab.spool.iterdir()) == []  # every spool file went with its request


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_forged_request_does_not_spend_the_genuine_nonce(lab: LocalLab, version: str) -> None:
    incident = "inc-" + uuid.uuid4().hex[:10]
    body, content_type = encode_multipart({"identity": json.dumps(identity(0, incident))},
                                          [("dump", "rank_0.pkl", (FIXTURE / "rank_0.pkl").read_bytes())])
    genuine = signed_headers(secret=lab.key.secret.encode(), key_id=lab.key.key_id, tenant="acme", cluster="c1",
                             method="POST", path="/v1/evidence", body=body) | {"Content-Type": content_type}
    forged = genuine | {"X-Denpex-Signature": f"{version}=" + "0" * 64}
    first = httpx.post(f"{lab.api.url}/v1/evidence", content=body, headers=forged)
    assert first.status_code == 401 and "does not match" in first.json()["error"], first.text
    second = httpx.post(f"{lab.api.url}/v1/evidence", content=body, headers=genuine)
    assert second.status_code == 201, second.text
    replay = httpx.post(f"{lab.api.url}/v1/evidence", content=body, headers=genuine)
    assert replay.status_code == 401 and "replayed" in replay.json()["error"], replay.text


def test_a_refusal_from_the_headers_reads_no_body(lab: LocalLab) -> None:
    """An unknown key is answered before the body is sent: the sender's first bytes get the 401."""
    status = slow_body(lab.api.port, attack_headers(lab, known=False), size=ATTACK_BODY, pause_s=0.5)
    assert status == 401


def test_a_sender_that_goes_away_leaves_no_spool_file(lab: LocalLab) -> None:
    """A genuine v2 sender (its signature verified, its declared 128 MiB reserved) that goes away mid-body."""
    sock = socket.create_connection(("127.0.0.1", lab.api.port), timeout=5)
    size = 128 * MiB  # within the key's share of the spool (a quarter of 900 MiB)
    declared = {"X-Denpex-Content-Length": str(size), "X-Denpex-Content-SHA256": "0" * 64}
    headers = signed_headers(secret=lab.key.secret.encode(), key_id=lab.key.key_id, tenant="acme", cluster="c1",
                             method="POST", path="/v1/evidence", body=b"")
    headers |= declared | {"X-Denpex-Signature": _sign_declared(lab, headers, size, "0" * 64)}
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall((f"POST /v1/evidence HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {size}\r\n"
                  "Content-Type: multipart/form-data; boundary=x\r\n" + head + "\r\n").encode())
    for _ in range(8):
        sock.sendall(b"\0" * MiB)
    deadline = time.monotonic() + 60
    while not list(lab.spool.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(lab.spool.iterdir()), "the body never reached the spool"
    sock.close()  # gone, mid-body
    deadline = time.monotonic() + 60
    while list(lab.spool.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(lab.spool.iterdir()) == []


def _sign_declared(lab: LocalLab, headers: dict[str, str], length: int, sha256: str) -> str:
    """A genuine v2 signature for a body declared, not built (the sender means to stream it)."""
    message = canonical_string_v2("POST", "/v1/evidence", "acme", "c1", int(headers["X-Denpex-Timestamp"]),
                                  headers["X-Denpex-Nonce"], DeclaredBody(length=length, sha256=sha256))
    return "v2=" + hmac.new(lab.key.secret.encode(), message.encode(), hashlib.sha256).hexdigest()
