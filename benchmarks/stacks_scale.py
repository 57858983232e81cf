"""Reading stacks at scale: 4,096 ranks' collector stacks files, and torch's debug-server file.

    .venv/bin/python benchmarks/stacks_scale.py                    # 4,096 ranks, 3 runs
    .venv/bin/python benchmarks/stacks_scale.py --ranks 512 --runs 5 --json /tmp/stacks.json
    .venv/bin/python benchmarks/stacks_scale.py --triage --runs 2   # denpex triage, without and with

With ``--triage`` it measures what the stacks add to the whole command: a synthetic 2,000-entry
dump set of N ranks (``testkit.generators.expansion``, scenario ``withheld``, as
``benchmarks/triage_scale.py`` makes it) is triaged by ``denpex triage DIR --format json``
without any stacks file, then the same folder gains every rank's collector stacks file and the
debug server's file (the culprit asleep in its data loader), and it is triaged again; the runs
alternate (without, with, without, with, ...) so that a change in the machine's load falls on both.

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
from typing import Any

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


def write_stacks_beside(folder: Path, ranks: int, culprit: int, at: datetime) -> int:
    """Every rank's collector stacks file (the culprit asleep) and one debug-server file taken at
    ``at``, in a dump folder; the bytes written."""
    global SLEEPER
    SLEEPER = culprit
    staging = Path(tempfile.mkdtemp(prefix="stacks-", dir=folder.parent))
    try:
        written = generate(staging, ranks)
        shutil.move(str(staging / "collector"), folder / "collector")
        shutil.move(str(staging / "stacks_20261202_190811.txt"), folder / f"stacks_{at:%Y%m%d_%H%M%S}.txt")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


def triage_main(args: argparse.Namespace) -> int:
    """``denpex triage`` on the same dumps without and with stacks files, runs alternating."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from triage_scale import _denpex_argv, measure  # the same measuring as the triage benchmark

    from testkit.generators.expansion import generate_dump_set
    from testkit.generators.fr_template import load_template
    from testkit.generators.hang_model import Scenario

    folder = Path(tempfile.mkdtemp(prefix=f"denpex-stacks-triage-{args.ranks}-", dir=args.workdir))
    dumps = folder / "dumps"
    results: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    try:
        made = generate_dump_set(dumps, world_size=args.ranks, scenario=Scenario.WITHHELD,
                                 template=load_template(TEMPLATE), workers=2)
        print(f"generated {made.files:,} dumps ({made.bytes_written / 2**30:.2f} GiB) in {made.seconds:.1f} s",
              file=sys.stderr)
        culprits = [int(r) for r in json.loads((dumps / "expected.json").read_text())["culprits"]]
        stacks_written, as_of = 0, TAKEN_AT
        for i in range(args.runs * 2):
            mode = "without" if i % 2 == 0 else "with"
            if mode == "with" and not stacks_written:
                stacks_written = write_stacks_beside(dumps, args.ranks, culprits[0], as_of)
            out, err = folder / f"{mode}-{i}.json", folder / f"{mode}-{i}.err"
            m = measure(_denpex_argv() + ["triage", str(dumps), "--format", "json"], timeout_s=900,
                        mem_cap_bytes=16 * 2**30, stdout=out, stderr=err)
            if not m.finished or m.returncode != 0:
                raise SystemExit(f"{mode} run {i}: {m.stop_reason or m.returncode}: {err.read_text()[-2000:]}")
            report = json.loads(out.read_text())
            as_of = datetime.fromisoformat(report["as_of"])
            stack = report["candidates"][0].get("stack") if report["candidates"] else None
            if mode == "with" and (stack is None or not report["stack_groups"]):
                raise SystemExit(f"run {i}: the stacks were not read: {report['notes']}")
            results[mode].append({"wall_s": m.wall_s, "cpu_s": m.cpu_s, "verdict": report["verdict"],
                                  "candidates": [c["rank"] for c in report["candidates"]],
                                  "stack_groups": len(report.get("stack_groups", []))})
            print(f"run {i + 1} {mode:>7} stacks: {m.wall_s:.2f} s wall, {m.cpu_s:.2f} s CPU, "
                  f"verdict {report['verdict']} {[c['rank'] for c in report['candidates']]}", flush=True)
        step = time_the_stacks_step(dumps, json.loads((folder / "without-0.json").read_text()), args.runs)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    without = statistics.median(r["wall_s"] for r in results["without"])
    with_ = statistics.median(r["wall_s"] for r in results["with"])
    cpu_without = statistics.median(r["cpu_s"] for r in results["without"])
    cpu_with = statistics.median(r["cpu_s"] for r in results["with"])
    print(f"median wall: {without:.2f} s without stacks, {with_:.2f} s with ({(with_ / without - 1) * 100:+.1f}%); "
          f"CPU {cpu_without:.2f} s vs {cpu_with:.2f} s ({(cpu_with / cpu_without - 1) * 100:+.1f}%); "
          f"{args.ranks:,} ranks, stacks files {stacks_written / 2**20:.1f} MiB")
    print(f"the stacks step alone (attach_stacks, in this process, same folder): median {step['wall_s']:.2f} s wall, "
          f"{step['cpu_s']:.2f} s CPU = {step['wall_s'] / without * 100:.1f}% of the triage's median wall time without stacks")
    if args.json:
        args.json.write_text(json.dumps({"ranks": args.ranks, "runs": results, "stacks_bytes": stacks_written,
                                         "median_wall_without_s": without, "median_wall_with_s": with_,
                                         "stacks_step": step}, indent=1))
    return 0


def time_the_stacks_step(dumps: Path, report: dict[str, Any], runs: int) -> dict[str, float]:
    """What the stacks add, measured on their own: :func:`attach_stacks` on the triage's result
    without stacks (the same call ``triage_outcomes`` makes), where the machine's load moves the
    whole command's wall time by more than the step takes."""
    from denpex.analysis.stack_triage import attach_stacks
    from denpex.analysis.triage import take_inventory
    from denpex.evidence.store import open_store
    from denpex.report import TriageReport

    store = open_store(dumps)
    result = TriageReport.model_validate(report)
    dumps_by_rank = take_inventory(store).dumps
    walls, cpus = [], []
    for _ in range(runs):
        started, cpu = time.perf_counter(), time.process_time()
        attached = attach_stacks(result, store, dumps_by_rank, max_dump_bytes=1 << 30)
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
        if not attached.stack_groups:
            raise SystemExit("the stacks step read no stacks")
    return {"wall_s": round(statistics.median(walls), 3), "cpu_s": round(statistics.median(cpus), 3)}


TEMPLATE = Path(__file__).resolve().parent / "templates" / "gloo_rank0_2000.pkl.gz"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4096)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--triage", action="store_true", help="time denpex triage without and with stacks files")
    args = p.parse_args(argv)
    if args.triage:
        return triage_main(args)
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
