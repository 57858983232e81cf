"""Real services for the ingest tests, each on a free loopback port: the API, moto S3, Prefect.

Nothing here fakes a service: the API is ``denpex serve-api`` in its own process, S3 is moto's
HTTP server, the flow engine is ``prefect server start``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import httpx
from moto.server import ThreadedMotoServer

ROOT = Path(__file__).resolve().parents[2]
DENPEX = [sys.executable, "-m", "denpex"]
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}:\n"
                               + (log.read_text()[-3000:] if log else ""))
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s:\n" + (log.read_text()[-3000:] if log else ""))


class MotoS3:
    """moto's S3 in server mode. Its data lives in this process, so a stop and a start keep it."""

    def __init__(self, bucket: str = "evidence") -> None:
        self.bucket = bucket
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server: ThreadedMotoServer | None = None

    def start(self) -> None:
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port)
        self._server.start()
        self.client().create_bucket(Bucket=self.bucket) if not self._has_bucket() else None

    def _has_bucket(self) -> bool:
        return any(b["Name"] == self.bucket for b in self.client().list_buckets().get("Buckets", []))

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def client(self):  # noqa: ANN201 - a boto3 client
        return boto3.client("s3", endpoint_url=self.endpoint, **{
            "aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"})

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def read(self, key: str) -> bytes:
        return bytes(self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def manifest(self, incident_prefix: str, ranks: int, timeout_s: float = 20.0) -> dict:  # type: ignore[type-arg]
        """The incident's manifest once it lists ``ranks`` ranks (the service writes it within a second)."""
        import json

        deadline = time.monotonic() + timeout_s
        manifest: dict = {}  # type: ignore[type-arg]
        while time.monotonic() < deadline:
            if f"{incident_prefix}/manifest.json" in self.keys(incident_prefix + "/"):
                manifest = json.loads(self.read(f"{incident_prefix}/manifest.json"))
                if len(manifest.get("ranks", {})) >= ranks:
                    return manifest
            time.sleep(0.1)
        raise AssertionError(f"{incident_prefix}/manifest.json never listed {ranks} ranks: {manifest}")


class ApiServer:
    """``denpex serve-api`` in its own process, stoppable and restartable on the same port."""

    def __init__(self, state_dir: Path, store: str, *, s3_endpoint: str | None, prefect_api_url: str | None,
                 log_dir: Path, extra_args: list[str] | None = None) -> None:
        self.extra_args = list(extra_args or [])
        self.state_dir = state_dir
        self.store = store
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"serve-api-{self.port}.log"
        self.env = {**os.environ, **AWS_ENV, "DENPEX_STATE_DIR": str(state_dir),
                    "PYTHONPATH": str(ROOT)}
        if s3_endpoint:
            self.env["DENPEX_S3_ENDPOINT_URL"] = s3_endpoint
        self.env.pop("PREFECT_API_URL", None)
        if prefect_api_url:
            self.env["PREFECT_API_URL"] = prefect_api_url
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([*DENPEX, "serve-api", "--port", str(self.port), "--store", self.store,
                                          "--check-workers", "1", *self.extra_args],
                                         stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT,
                                         start_new_session=True)
        wait_http(f"{self.url}/healthz", 60, self.proc, self.log)

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(30)
        self.proc = None


class PrefectServer:
    """``prefect server start`` on SQLite in a temporary PREFECT_HOME."""

    def __init__(self, home: Path) -> None:
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self.log = home / "prefect-server.log"
        self.env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PREFECT_API_URL": self.api_url, "PREFECT_UI_ENABLED": "false",
                    "PREFECT_SERVER_API_PORT": str(self.port)}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        prefect = str(Path(sys.executable).with_name("prefect"))
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([prefect, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                                         stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        wait_http(f"{self.api_url}/health", 120, self.proc, self.log)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None
