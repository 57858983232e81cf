"""Reading stacks at scale: 4,096 ranks' collector stacks files, and torch's debug-server file.

    .venv/bin/python benchmarks/stacks_scale.py                    # 4,096 ranks, 3 runs
    .venv/bin/python benchmarks/stacks_scale.py --ranks 512 --runs 5 --json /tmp/stacks.json

Generates, in a temporary folder, what a hung job of N ranks leaves: per rank a collector stacks
file (``collector/rank_<r>.stacks.json``: the main thread 24 frames deep in an all_reduce, the
dumper's thread, two data-loader threads; one rank asleep in its data loader instead) and one
debug-server ``stacks_<time>.txt`` with every rank's section. Then, per run, it times:

- **read**: :func:`~denpex.evidence.stacks.read_stack_evidence` of the folder (every file read,
  bounded and validated; the debug file nearest the incident too);
- **findings**: :func:`~denpex.analysis.stack_findings.stack_findings` on those records (grouping
  every rank, the stuck group's outliers, the candidates' stacks).

Wall and CPU time are both printed: on a loaded machine the CPU time is the steadier figure
(one process, one thread). The figure to compare with is triage's own wall time on the same number of ranks
(``benchmarks/README.md``: 24.4 s at 4,096 ranks x 2,000 entries): the stacks must add under 10%.
The folder is deleted afterwards. Exits 0 (a measurement).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from denpex.analysis.stack_findings import stack_findings
from denpex.evidence.stacks import (
    RankStacks,
    StackFrame,
    StackSource,
    ThreadStack,
    read_stack_evidence,
    stacks_file_name,
)

C10D = "/usr/local/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
MEGATRON = "/workspace/Megatron-LM/megatron/core/"
THREADING = "/usr/lib/python3.11/threading.py"
TAKEN_AT = datetime(2026, 12, 2, 19, 8, 11, tzinfo=UTC)
SLEEPER = 2


def main_thread(rank: int) -> ThreadStack:
    outer = [StackFrame(file=f"{MEGATRON}layer_{i}.py", line=100 + i, function=f"forward_{i}") for i in range(20)]
    if rank == SLEEPER:
        inner = [StackFrame(file="/workspace/data.py", line=45, function="next_batch")]
    else:
        inner = [StackFrame(file=C10D, line=3252, function="all_reduce"),
                 StackFrame(file=C10D.replace("distributed_c10d", "c10d_logger"), line=83, function="wrapper"),
                 StackFrame(file=f"{MEGATRON}finalize_model_grads.py", line=141, function="allreduce_grads")]
    return ThreadStack(name="MainThread", id=140000 + rank, frames=inner + outer)


def side_threads(rank: int) -> list[ThreadStack]:
    wait = [StackFrame(file=THREADING, line=327, function="Condition.wait"),
            StackFrame(file=THREADING, line=629, function="Event.wait"),
            StackFrame(file=THREADING, line=982, function="Thread.run")]
    return [ThreadStack(name=f"denpex-hang-dumper-{rank}", id=1, frames=wait),
            ThreadStack(name="pin_memory", id=2, frames=wait), ThreadStack(name="loader-0", id=3, frames=wait)]


def generate(folder: Path, ranks: int) -> int:
    """Write every rank's collector file and one debug-server file; return the bytes written."""
    (folder / "collector").mkdir(parents=True)
    total = 0
    sections = []
    for rank in range(ranks):
        stacks = RankStacks(rank=rank, source=StackSource.COLLECTOR, taken_at=TAKEN_AT, pid=1000 + rank,
                            threads=[main_thread(rank), *side_threads(rank)])
        data = stacks.model_dump_json().encode()
        (folder / "collector" / stacks_file_name(rank)).write_bytes(data)
        total += len(data)
        body = "\n".join(f'  File "{f.file}", line {f.line} in {f.function}' for f in main_thread(rank).frames)
        sections.append(f"=== Rank {rank}: http://node-{rank // 8}:4000/handler/dump_traceback? ===\n"
                        f"Current thread 0x00007f0000000001 (most recent call first):\n  <no Python frame>\n\n"
                        f"Thread 0x00007f0000000002 (most recent call first):\n{body}\n"
                        f'  File "/workspace/pretrain_gpt.py", line 284 in <module>\n')
    debug = "\n".join(sections).encode()
    (folder / "stacks_20261202_190811.txt").write_bytes(debug)
    return total + len(debug)


def run_once(folder: Path, ranks: int) -> dict[str, float | int]:
    started, cpu = time.perf_counter(), time.process_time()
    evidence = read_stack_evidence(folder, at=TAKEN_AT)
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    found = stack_findings(evidence.records, stuck_groups={"0": list(range(ranks))}, candidates=[SLEEPER])
    findings_s = time.perf_counter() - started
    cpu_s = time.process_time() - cpu
    if [o.rank for o in found.outliers.get("0", [])] != [SLEEPER] or evidence.refused:
        raise SystemExit(f"wrong findings: outliers {found.outliers}, refused {evidence.refused}")
    return {"records": len(evidence.records), "read_s": round(read_s, 3), "findings_s": round(findings_s, 3),
            "total_s": round(read_s + findings_s, 3), "cpu_s": round(cpu_s, 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4096)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="denpex-stacks-", dir=args.workdir))
    try:
        started = time.perf_counter()
        written = generate(folder, args.ranks)
        print(f"generated {args.ranks:,} ranks' stacks ({written / 2**20:.1f} MiB) in "
              f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
        runs = [run_once(folder, args.ranks) for _ in range(args.runs)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    median = statistics.median(r["total_s"] for r in runs)
    result = {"ranks": args.ranks, "bytes": written, "runs": runs, "median_total_s": median}
    for i, r in enumerate(runs, 1):
        print(f"run {i}: {r['records']:,} records, read {r['read_s']:.3f} s, findings {r['findings_s']:.3f} s, "
              f"total {r['total_s']:.3f} s wall, {r['cpu_s']:.3f} s CPU")
    print(f"median total: {median:.3f} s wall, {statistics.median(r['cpu_s'] for r in runs):.3f} s CPU "
          f"for {args.ranks:,} ranks")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
