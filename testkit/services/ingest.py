"""``denpex serve-api`` in its own process on a free loopback port, for the ingest tests.

Nothing here fakes a service: the API is the real one, its store is moto's HTTP S3
(:mod:`testkit.services.s3`), its flow engine ``prefect server start``
(:mod:`testkit.services.prefect`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from testkit.services.net import free_port, wait_http
from testkit.services.process_group import stop_process_group
from testkit.services.s3 import AWS_ENV

__all__ = ["ROOT", "DENPEX", "ApiServer", "process_tree_pss"]

ROOT = Path(__file__).resolve().parents[2]
DENPEX = [sys.executable, "-m", "denpex"]


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
        # Two S3 attempts, not the default five: moto on loopback answers at once, and the tests
        # that stop it want the service's refusal, not ten seconds of botocore's back-off.
        self.env = {**os.environ, **AWS_ENV, "AWS_MAX_ATTEMPTS": "2", "DENPEX_STATE_DIR": str(state_dir),
                    "PYTHONPATH": str(ROOT)}
        if s3_endpoint:
            self.env["DENPEX_S3_ENDPOINT_URL"] = s3_endpoint
        self.env.pop("PREFECT_API_URL", None)
        if prefect_api_url:
            self.env["PREFECT_API_URL"] = prefect_api_url
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The server's process id (its workers are its descendants)."""
        if self.proc is None:
            raise RuntimeError("the server is not running")
        return self.proc.pid

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([*DENPEX, "serve-api", "--port", str(self.port), "--store", self.store,
                                          "--check-workers", "1", *self.extra_args],
                                         stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT,
                                         start_new_session=True)
        wait_http(f"{self.url}/healthz", 60, self.proc, self.log)

    def stop(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, sig=sig, timeout_s=30)
        self.proc = None


def process_tree_pss(pid: int) -> int:
    """Bytes of memory (PSS, so pages shared with forked children count once) of ``pid`` and every
    descendant, read from ``/proc``: the service with its dump-checking workers and their forkserver."""
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields after the last ')' are fixed.
        children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry))
    total, stack = 0, [pid]
    while stack:
        current = stack.pop()
        stack.extend(children.get(current, []))
        try:
            for line in Path(f"/proc/{current}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue  # gone meanwhile
    return total
