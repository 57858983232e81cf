"""moto's S3 in server mode on a free loopback port: a real HTTP S3 endpoint for the ingest tests."""

from __future__ import annotations

import json
import time
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

from testkit.services.net import free_port

__all__ = ["AWS_ENV", "MotoS3"]

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


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
        if not self._has_bucket():
            self.client().create_bucket(Bucket=self.bucket)

    def _has_bucket(self) -> bool:
        return any(b["Name"] == self.bucket for b in self.client().list_buckets().get("Buckets", []))

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def client(self) -> Any:
        """A boto3 S3 client for this endpoint (boto3 ships no types for its clients)."""
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(item["Key"] for page in pages for item in page.get("Contents", []))

    def read(self, key: str) -> bytes:
        return bytes(self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def manifest(self, incident_prefix: str, ranks: int, timeout_s: float = 20.0) -> dict[str, Any]:
        """The incident's manifest once it lists ``ranks`` ranks (the service writes it within a second)."""
        deadline = time.monotonic() + timeout_s
        manifest: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if f"{incident_prefix}/manifest.json" in self.keys(incident_prefix + "/"):
                manifest = json.loads(self.read(f"{incident_prefix}/manifest.json"))
                if len(manifest.get("ranks", {})) >= ranks:
                    return manifest
            time.sleep(0.1)
        raise AssertionError(f"{incident_prefix}/manifest.json never listed {ranks} ranks: {manifest}")
