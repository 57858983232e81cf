"""A client of the ingest service that signs every request (collectors, scripts, tests, benchmarks).

The multipart body is built here, byte for byte, because the signature covers the whole body. Every
request is signed v2 (:mod:`denpex.ingest.signing`): the body's length and SHA-256 travel in signed
headers, so the service checks the signature before it reserves anything for the body::

    client = IngestClient("http://127.0.0.1:8080", key_id="dk_...", secret="...", tenant="acme", cluster="c1")
    client.upload(identity, dump_bytes, "rank_3.pkl")      # -> httpx.Response
    client.upload(identity, dump_bytes, "rank_3.pkl", stacks=stacks_json)   # with the rank's stacks
    client.register("job-123", {"world_size": 4, "ranks": {"3": {"host": "gpu-node-004"}}})
    client.upload_telemetry({"job_id": "job-123"}, [kernel_log_bytes])   # a node agent's key
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import httpx
from pydantic import SecretStr

from denpex.ingest.signing import request_target, signed_headers

__all__ = ["encode_multipart", "IngestClient"]


def encode_multipart(fields: Mapping[str, str], files: Sequence[tuple[str, str, bytes]]) -> tuple[bytes, str]:
    """``multipart/form-data``: text fields, then ``(part name, file name, bytes)`` files.

    Returns the body and its Content-Type (with the boundary).
    """
    boundary = "denpex-" + secrets.token_hex(16)
    out = bytearray()
    for name, value in fields.items():
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n"
                "Content-Type: application/json\r\n\r\n").encode()
        out += value.encode() + b"\r\n"
    for name, filename, data in files:
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\n"
                "Content-Type: application/octet-stream\r\n\r\n").encode()
        out += data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out), f"multipart/form-data; boundary={boundary}"


_SHARED_HTTP: httpx.Client | None = None
_SHARED_LOCK = threading.Lock()


def _shared_http() -> httpx.Client:
    """The client of every :class:`IngestClient` given none, made once per process.

    Each new httpx client builds an SSL context (66 ms of CPU measured), which a client per
    request paid every time: a collector sending many files, a node agent, a test sending
    thousands. No connection is kept alive between requests, as with a client per request, so a
    restarted service is reached afresh.
    """
    global _SHARED_HTTP
    with _SHARED_LOCK:
        if _SHARED_HTTP is None:
            _SHARED_HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))
        return _SHARED_HTTP


class IngestClient:
    """Signs and sends requests for one key (one tenant and cluster)."""

    def __init__(self, base_url: str, *, key_id: str, secret: str | SecretStr, tenant: str, cluster: str,
                 timeout_s: float = 60.0, http: httpx.Client | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.key_id = key_id
        self._secret = secret if isinstance(secret, SecretStr) else SecretStr(secret)
        self.tenant = tenant
        self.cluster = cluster
        self._timeout_s = timeout_s
        self._http = http

    def signed(self, method: str, path: str, body: bytes) -> dict[str, str]:
        """The v2 authentication headers for one request (fresh nonce, current time); ``path`` is the target."""
        return signed_headers(secret=self._secret.get_secret_value().encode(), key_id=self.key_id,
                              tenant=self.tenant, cluster=self.cluster, method=method, path=path, body=body)

    def send(self, method: str, path: str, body: bytes = b"", *, content_type: str | None = None,
             params: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None) -> httpx.Response:
        """Sign ``body`` for the request target (``path``, and ``?query`` when ``params`` are given) and send it.

        The query string is encoded here, once, and sent as signed: the server checks the
        signature against the query exactly as it arrives.
        """
        target = request_target(path, urlencode(dict(params)) if params else "")
        all_headers = self.signed(method, target, body)
        if content_type:
            all_headers["Content-Type"] = content_type
        all_headers.update(headers or {})
        http = self._http if self._http is not None else _shared_http()
        return http.request(method, self.base_url + target, content=body, headers=all_headers,
                            timeout=self._timeout_s)

    def upload(self, identity: Mapping[str, Any], dump: bytes, filename: str,
               telemetry: Sequence[bytes] = (), *, stacks: bytes | None = None,
               stacks_pyspy: bytes | None = None) -> httpx.Response:
        """``POST /v1/evidence``: one rank's dump with its identity (and telemetry files, and its
        stacks files: ``stacks`` the collector's, ``stacks_pyspy`` the py-spy sidecar's)."""
        extra = [(part, name, data) for part, name, data in (
            ("stacks", "stacks.json", stacks), ("stacks_pyspy", "py-spy.stacks.json", stacks_pyspy))
            if data is not None]
        body, content_type = encode_multipart(
            {"identity": json.dumps(dict(identity), default=str)},
            [("dump", filename, dump)] + [("telemetry", f"telemetry-{i}.log", t) for i, t in enumerate(telemetry)]
            + extra)
        return self.send("POST", "/v1/evidence", body, content_type=content_type)

    def upload_telemetry(self, identity: Mapping[str, Any], telemetry: Sequence[bytes]) -> httpx.Response:
        """``POST /v1/evidence`` without a dump: a node agent's telemetry for a job's incident
        (``identity``: ``job_id`` and optionally ``incident_id``, ``host``)."""
        body, content_type = encode_multipart(
            {"identity": json.dumps(dict(identity), default=str)},
            [("telemetry", f"telemetry-{i}.log", t) for i, t in enumerate(telemetry)])
        return self.send("POST", "/v1/evidence", body, content_type=content_type)

    def register(self, job_id: str, registration: Mapping[str, Any]) -> httpx.Response:
        """``POST /v1/jobs/{job_id}/ranks``: where the job's ranks run (``world_size``, ``ranks``,
        ``process_groups``, as in the manifest)."""
        return self.send("POST", f"/v1/jobs/{job_id}/ranks", json.dumps(dict(registration), default=str).encode(),
                         content_type="application/json")

    def job_ranks(self, job_id: str) -> httpx.Response:
        """``GET /v1/jobs/{job_id}/ranks``: the registered layout, with every recorded move."""
        return self.send("GET", f"/v1/jobs/{job_id}/ranks")

    def alert(self, alert: Mapping[str, Any]) -> httpx.Response:
        """``POST /v1/alerts`` with Denpex's alert JSON."""
        return self.send("POST", "/v1/alerts", json.dumps(dict(alert), default=str).encode(),
                         content_type="application/json")

    def watchdog_line(self, line: str, *, job_id: str, incident_id: str | None = None) -> httpx.Response:
        """``POST /v1/alerts`` with a raw watchdog log line (``text/plain``)."""
        params = {"job_id": job_id} | ({"incident_id": incident_id} if incident_id else {})
        return self.send("POST", "/v1/alerts", line.encode(), content_type="text/plain", params=params)

    def incident(self, incident_id: str) -> httpx.Response:
        """``GET /v1/incidents/{id}``: coverage and the flow run's state."""
        return self.send("GET", f"/v1/incidents/{incident_id}")
