"""Signed uploads at scale: N real-size dumps from concurrent clients into moto S3 through the service.

    .venv/bin/python benchmarks/ingest_scale.py                    # 4,096 uploads, 4 client processes x 8 threads
    .venv/bin/python benchmarks/ingest_scale.py --uploads 512 --clients 2 --threads 4

What runs, all on loopback: a 4,096-rank NCCL-style dump set (``testkit.generators.expansion``,
2,000-entry rings from the real template, ~225 KiB a dump) is generated; moto's S3 server runs in
its own process; ``denpex serve-api`` runs in its own process (dump checks in 2 worker processes);
client processes sign and send one upload per rank (``denpex.ingest.client``), each from its own
threads. Reported: uploads per second (wall, first send to last answer), p50/p90/p99/max latency
per upload, every status code, then the check that none was lost or duplicated: every rank's
dump is in S3 byte for byte (sha256), exactly one version per rank, one database row per rank,
and a second upload of a sample answers ``stored: false``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testkit.services.net import free_port, wait_http  # noqa: E402

AWS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def _tree_cpu_s(root: int) -> float:
    """User+system CPU seconds of ``root`` and its live descendants (steadier than wall on shared cores)."""
    ticks = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / ticks
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(cpu.get(pid, 0.0) for pid in tree)


def _upload_slice(args: tuple[str, dict[str, str], list[tuple[int, str]], int, int, str]) -> list[tuple[int, int, float, bool]]:
    """One client process: upload its ranks from ``threads`` threads; (rank, status, seconds, stored)."""
    url, key, files, threads, world, incident = args
    import httpx

    from denpex.ingest.client import IngestClient

    def one(item: tuple[int, str]) -> tuple[int, int, float, bool]:
        rank, path = item
        data = Path(path).read_bytes()
        identity = {"job_id": "bench-job", "incident_id": incident, "rank": rank, "world_size": world,
                    "host": f"node-{rank // 8:04d}", "local_rank": rank % 8}
        started = time.perf_counter()
        with httpx.Client() as http:
            client = IngestClient(url, key_id=key["key_id"], secret=key["secret"], tenant="bench", cluster="c1",
                                  http=http, timeout_s=300)
            response = client.upload(identity, data, Path(path).name)
        elapsed = time.perf_counter() - started
        stored = response.status_code < 300 and bool(response.json().get("stored"))
        return rank, response.status_code, elapsed, stored

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, files))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--uploads", type=int, default=4096, help="ranks, one upload each (a multiple of 32)")
    p.add_argument("--clients", type=int, default=4, help="client processes")
    p.add_argument("--threads", type=int, default=8, help="threads per client process")
    p.add_argument("--check-workers", type=int, default=2, help="the service's dump-checking processes")
    p.add_argument("--ring", type=int, default=2000, help="entries per dump ring")
    p.add_argument("--template", type=Path, default=ROOT / "benchmarks" / "templates" / "gloo_rank0_2000.pkl.gz")
    p.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = p.parse_args(argv)

    from denpex.ingest.plans import PlanTier
    from denpex.ingest.registry import Registry
    from testkit.generators.expansion import generate_dump_set
    from testkit.generators.fr_template import load_template
    from testkit.generators.hang_model import Scenario

    work = Path(tempfile.mkdtemp(prefix="denpex-ingest-bench-"))
    dumps = work / "dumps"
    started = time.perf_counter()
    generate_dump_set(dumps, world_size=args.uploads, scenario=Scenario.STALLED,
                             template=load_template(args.template), ring_size=args.ring, workers=2, manifest=False)
    files = sorted((int(f.name.rsplit("_", 1)[1]), str(f)) for f in dumps.iterdir() if f.name.startswith("comm_lib"))
    sizes = [Path(f).stat().st_size for _, f in files]
    print(f"generated {len(files)} dumps, {sum(sizes) / 2**20:.0f} MiB (median {statistics.median(sizes) / 1024:.0f} KiB) "
          f"in {time.perf_counter() - started:.1f} s", flush=True)

    env = {**os.environ, **AWS, "PYTHONPATH": str(ROOT)}
    moto_port, api_port = free_port(), free_port()
    endpoint = f"http://127.0.0.1:{moto_port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        moto = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p",
                                 str(moto_port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        procs.append(moto)
        wait_http(endpoint, 120, moto)
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                          aws_secret_access_key="bench")
        s3.create_bucket(Bucket="bench")
        state = work / "state"
        registry = Registry(state)
        registry.add_tenant("bench", PlanTier.DATA_CENTER)
        key = registry.create_key("bench", "c1")
        api_env = {**env, "DENPEX_STATE_DIR": str(state), "DENPEX_S3_ENDPOINT_URL": endpoint}
        api_env.pop("PREFECT_API_URL", None)
        api = subprocess.Popen([sys.executable, "-m", "denpex", "serve-api", "--port", str(api_port), "--store",
                                "s3://bench/ingest", "--check-workers", str(args.check_workers)],
                               env=api_env, stdout=(work / "api.log").open("wb"), stderr=subprocess.STDOUT,
                               start_new_session=True)
        procs.append(api)
        url = f"http://127.0.0.1:{api_port}"
        wait_http(f"{url}/healthz", 120, api)

        incident = "bench-incident"
        key_fields = {"key_id": key.key_id, "secret": key.secret}
        slices = [files[i::args.clients] for i in range(args.clients)]
        print(f"uploading {len(files)} dumps from {args.clients} client processes x {args.threads} threads ...",
              flush=True)
        load_before = os.getloadavg()[0]
        api_cpu0, moto_cpu0 = _tree_cpu_s(api.pid), _tree_cpu_s(moto.pid)
        t0 = time.perf_counter()
        with ProcessPoolExecutor(args.clients) as pool:
            results = [r for part in pool.map(_upload_slice, [(url, key_fields, s, args.threads, args.uploads, incident)
                                                              for s in slices]) for r in part]
        wall = time.perf_counter() - t0
        api_cpu, moto_cpu = _tree_cpu_s(api.pid) - api_cpu0, _tree_cpu_s(moto.pid) - moto_cpu0
        latencies = sorted(r[2] for r in results)
        statuses: dict[int, int] = {}
        for _, status, _, _ in results:
            statuses[status] = statuses.get(status, 0) + 1

        def pct(q: float) -> float:
            return latencies[min(len(latencies) - 1, int(q * len(latencies)))]

        figures: dict[str, Any] = {
            "uploads": len(results), "clients": args.clients, "threads_per_client": args.threads,
            "check_workers": args.check_workers, "bytes": sum(sizes), "wall_s": round(wall, 2),
            "uploads_per_s": round(len(results) / wall, 1), "mib_per_s": round(sum(sizes) / 2**20 / wall, 1),
            "latency_s": {"p50": round(pct(0.50), 3), "p90": round(pct(0.90), 3), "p99": round(pct(0.99), 3),
                          "max": round(latencies[-1], 3)},
            "statuses": statuses, "stored_true": sum(1 for r in results if r[3]),
            "service_cpu_s_per_upload": round(api_cpu / len(results), 4),
            "moto_cpu_s_per_upload": round(moto_cpu / len(results), 4),
            "load_average_1m": {"before": round(load_before, 1), "after": round(os.getloadavg()[0], 1)},
            "cpus": os.cpu_count(),
        }
        print(json.dumps(figures, indent=1), flush=True)

        # None lost, none duplicated: S3, the database, and a re-upload of a sample.
        base = f"ingest/bench/c1/bench-job/{incident}"
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket="bench", Prefix=base + "/")
        keys = {item["Key"]: item for page in pages for item in page.get("Contents", [])}
        current = [k for k in keys if "/versions/" not in k and "/rank_" in k]
        versions = [k for k in keys if "/versions/" in k]
        mismatched = 0
        for rank, path in files[:: max(1, len(files) // 256)]:
            body = s3.get_object(Bucket="bench", Key=f"{base}/rank_{rank}.pkl")["Body"].read()
            mismatched += hashlib.sha256(body).digest() != hashlib.sha256(Path(path).read_bytes()).digest()
        db = sqlite3.connect(state / "ingest.sqlite3")
        rows, distinct, max_version = db.execute(
            "SELECT COUNT(*), COUNT(DISTINCT rank), MAX(version) FROM uploads WHERE incident_id = ?", (incident,)).fetchone()
        db.close()
        again = _upload_slice((url, key_fields, files[:64], 8, args.uploads, incident))
        check = {"current_objects": len(current), "version_objects": len(versions), "db_rows": rows,
                 "db_distinct_ranks": distinct, "max_version": max_version, "sampled_sha_mismatches": mismatched,
                 "reupload_sample": len(again), "reupload_stored_false": sum(1 for r in again if r[1] == 200 and not r[3])}
        ok = (len(current) == len(files) and len(versions) == len(files) and rows == len(files) == distinct
              and max_version == 1 and mismatched == 0 and check["reupload_stored_false"] == len(again)
              and figures["stored_true"] == len(files))
        check["none_lost_or_duplicated"] = ok
        print(json.dumps(check, indent=1), flush=True)
        if args.out:
            args.out.write_text(json.dumps({"figures": figures, "check": check}, indent=1))
        return 0 if ok else 1
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        import shutil

        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
