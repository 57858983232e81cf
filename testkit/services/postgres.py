"""A real PostgreSQL for tests: Debian's postgresql 15 (initdb + pg_ctl, no system service) on a
free loopback port, in a fresh folder, stopped and removed after use. Prefect servers run on it
(:mod:`testkit.services.prefect`)::

    with postgres_database() as url, prefect_server(tmp, database_url=url) as server:
        ...
        psql(url, "select count(*) from flow_run")
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from testkit.services.net import free_port

__all__ = ["PG_BIN", "postgres_database", "psql"]

PG_BIN = Path("/usr/lib/postgresql/15/bin")


@contextmanager
def postgres_database(name: str = "prefect", startup_timeout: float = 60.0) -> Iterator[str]:
    """A fresh PostgreSQL cluster on a free port; yields an asyncpg URL to database ``name``.

    As root, PostgreSQL runs as the ``postgres`` user (initdb refuses root), so its folder is a
    fresh one under /tmp owned by that user (pytest's tmp_path is private to root).
    """
    for program in ("initdb", "pg_ctl", "psql"):
        if not (PG_BIN / program).exists():
            raise RuntimeError(f"{PG_BIN / program} is missing: run scripts/install_system_deps.sh")
    as_root = os.geteuid() == 0
    base = Path(tempfile.mkdtemp(prefix="denpex-pg-"))
    if as_root:
        shutil.chown(base, user="postgres")
    data, port = base / "data", free_port()

    def run(*argv: str) -> None:
        command = list(argv)
        if as_root:
            command = ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(command)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=startup_timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stdout}{done.stderr}")

    run(str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-t", str(int(startup_timeout)), "-l", str(base / "log"),
        "-o", f"-p {port} -k {base} -c listen_addresses=127.0.0.1", "start")
    try:
        run(str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
            "-c", f"create database {name}")
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/{name}"
    finally:
        run(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


def psql(database_url: str, sql: str) -> str:
    """Run one SQL statement against the database of ``postgres_database``; its output, unaligned."""
    port = database_url.rsplit(":", 1)[1].split("/")[0]
    name = database_url.rsplit("/", 1)[1]
    command = [str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", port, "-U", "postgres", "-d", name, "-tAc", sql]
    if os.geteuid() == 0:
        command = ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(command)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"psql failed ({done.returncode}): {done.stderr}")
    return done.stdout.strip()
