"""Triage at scale, side by side on the same files: ``denpex triage``, torch's analyzer, the floor.

For each size (ranks x 2,000-entry rings) a synthetic NCCL-style dump set is generated from the
real template (``testkit.generators.expansion``), or a Gloo-style one for scenario ``gloo``
(``testkit.generators.gloo_expansion``: scheduled and retired entries, no p2p, a share of the ranks
in Gloo's retire race), then three programs run on it, one after the other,
each in its own process tree, with a time cap and a memory cap:

- **floor**: the bare safe-unpickle of every dump on one core (a restricted ``pickle.Unpickler``
  whose ``find_class`` raises, fed from the open file; each result is dropped);
- **denpex**: ``denpex triage DIR --format json``; its verdict and culprits are compared with the
  set's ``expected.json``;
- **torchfrtrace**: ``python -m torch.distributed.flight_recorder.fr_trace DIR --prefix P
  --allow-incomplete-ranks``; its output is searched for the ranks it blames.

Reported per run: wall time, CPU time of the whole process tree (this process becomes a child
subreaper, so the parse pool's workers and their forkserver, orphaned when the program exits, are
reaped here and their CPU counted), peak memory of the whole process tree (RSS summed over the tree,
sampled every 0.2 s, and PSS, which counts pages shared by forked workers once), the largest
single-process max RSS (``wait4``), the ratio to the floor, and whether the verdict was right.
The generated files are deleted after each size unless ``--keep``.

Examples::

    .venv/bin/python benchmarks/triage_scale.py --quick --out /tmp/scale-quick.json
    .venv/bin/python benchmarks/triage_scale.py --out /tmp/scale.json            # 512, 4096, 32768
    .venv/bin/python benchmarks/triage_scale.py --sizes 512,4096 --tools floor,torchfrtrace

Each run stops on its own: every program has a time cap (``--*-timeout``) and the memory cap
(``--mem-cap-gb``); a program that hits one is killed with its process group and reported as
"did not finish".
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the test kit (testkit/) is imported from the repo root
DEFAULT_TEMPLATE = REPO / "benchmarks" / "templates" / "gloo_rank0_2000.pkl.gz"
FULL_SIZES = (512, 4096, 32768)
QUICK_SIZES = (256,)
TOOLS = ("floor", "denpex", "torchfrtrace")
# Gloo-style (testkit.generators.gloo_expansion): states scheduled and retired, no p2p, the world
# group and tp pairs, one rank never enters a world all_reduce, a share of the ranks shows the
# retire race on its pair's newest op. The NCCL-style scenarios are hang_model.Scenario's.
GLOO = "gloo"
_PAGE = os.sysconf("SC_PAGE_SIZE")
_POLL_S = 0.2
_OUTPUT_CAP = 512 * 1024 * 1024  # torchfrtrace prints stacks per mismatch; cap the log file


# ---------------------------------------------------------------------------------------------
# Measuring one program
# ---------------------------------------------------------------------------------------------
@dataclass
class Measurement:
    """One program's run."""

    argv: list[str]
    wall_s: float
    cpu_s: float
    """User + system CPU of the whole process tree: the program, the children it waited for, and
    the descendants it left orphaned (reaped here as their subreaper). Steadier than wall time
    when other work shares the cores."""
    sys_s: float
    """The system part of ``cpu_s`` (reading files, mapping memory)."""
    returncode: int | None
    finished: bool
    stop_reason: str = ""
    """Empty when the program exited by itself; else ``time cap`` or ``memory cap``."""
    peak_rss_tree_mb: float = 0.0
    peak_pss_tree_mb: float = 0.0
    max_rss_single_mb: float = 0.0
    load_before: float = 0.0
    load_after: float = 0.0
    main_cpu_s: float = 0.0
    """The part of ``cpu_s`` spent in the program's own process (and the children it waited for)."""


def _processes() -> Iterator[tuple[int, list[bytes]]]:
    """Each process's pid and its /proc/PID/stat fields after the command name (state, ppid,
    pgrp, ...); a process that ends while listed is skipped."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after the last ')'.
        yield int(entry.name), stat[stat.rindex(b")") + 2:].split()


def _tree(root: int) -> list[int]:
    """``root`` and its descendants, from /proc (no psutil here)."""
    children: dict[int, list[int]] = {}
    for pid, fields in _processes():
        children.setdefault(int(fields[1]), []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _memory(pids: list[int], with_pss: bool) -> tuple[int, int]:
    rss = pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", "rb") as fh:
                rss += int(fh.read().split()[1]) * _PAGE
            if with_pss:
                with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
                    for line in fh:
                        if line.startswith(b"Pss:"):
                            pss += int(line.split()[1]) * 1024
                            break
        except (OSError, ValueError, IndexError):
            continue  # the process ended between listing and reading
    return rss, pss


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt this process's orphaned descendants, so their CPU time can be collected by ``wait4``.

    A forkserver pool's workers are children of the forkserver, which nobody waits for once the
    program exits: without this their CPU time is lost to ``init``. Linux only; False elsewhere.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _group_members(pgid: int) -> list[int]:
    """Processes still in process group ``pgid`` (field 5 of /proc/PID/stat)."""
    return [pid for pid, fields in _processes() if int(fields[2]) == pgid]


@dataclass
class _Orphans:
    """What the reaped descendants used, and whether some could not be reaped in time."""

    user_s: float = 0.0
    sys_s: float = 0.0
    max_rss_kb: int = 0
    left: int = 0


def _reap_group(pgid: int, deadline_s: float = 10.0) -> _Orphans:
    """Reap what is left of process group ``pgid``; sum their CPU, keep their largest max RSS.

    A descendant becomes our child only once its own parent is gone, so poll until no process
    of the group is left, killing the group again each round (a fork may have raced the first
    kill) and waiting on each as it is reparented to us. A descendant that left the group
    (``setsid``) is not seen: Denpex's workers do not.
    """
    found = _Orphans()
    stop = time.monotonic() + deadline_s
    while True:
        try:
            pid, _, usage = os.wait4(-pgid, os.WNOHANG)
        except ChildProcessError:
            pid = 0
            members = _group_members(pgid)
            if not members:
                return found
            if time.monotonic() > stop:
                found.left = len(members)
                return found
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if pid:
            found.user_s += usage.ru_utime
            found.sys_s += usage.ru_stime
            found.max_rss_kb = max(found.max_rss_kb, usage.ru_maxrss)
        else:
            time.sleep(0.02)


def measure(
    argv: list[str], *, timeout_s: float, mem_cap_bytes: int, stdout: Path, stderr: Path,
    env: dict[str, str] | None = None, output_cap: int | None = None,
) -> Measurement:
    """Run ``argv`` in its own session; sample its tree's memory; kill the group at a cap."""

    def limits() -> None:
        if output_cap:
            resource.setrlimit(resource.RLIMIT_FSIZE, (output_cap, output_cap))

    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, start_new_session=True,
                                cwd=REPO, env=env, preexec_fn=limits)
    peak_rss = peak_pss = 0
    reason = ""
    status = None
    usage = None
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        pids = _tree(proc.pid)
        rss, pss = _memory(pids, with_pss=len(pids) <= 16)
        peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
        elapsed = time.perf_counter() - started
        if not reason and elapsed > timeout_s:
            reason = f"time cap {timeout_s:.0f} s"
        elif not reason and rss > mem_cap_bytes:
            reason = f"memory cap {mem_cap_bytes / 2**30:.1f} GiB"
        if reason:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the session we started, and only it
            except ProcessLookupError:
                pass
            _, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(_POLL_S)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    try:  # workers the program left behind, if any, go with the group
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    # Orphaned descendants (a forkserver and its workers) come to us as their subreaper.
    orphans = _reap_group(proc.pid)
    if orphans.left:
        print(f"  warning: {orphans.left} process(es) of the group outlived the 10 s reap; their CPU "
              "is not counted", file=sys.stderr)
    main_cpu = usage.ru_utime + usage.ru_stime if usage else 0.0
    return Measurement(
        argv=argv, wall_s=round(wall, 2),
        cpu_s=round(main_cpu + orphans.user_s + orphans.sys_s, 2),
        sys_s=round((usage.ru_stime if usage else 0.0) + orphans.sys_s, 2),
        main_cpu_s=round(main_cpu, 2),
        returncode=proc.returncode, finished=not reason,
        stop_reason=reason, peak_rss_tree_mb=round(peak_rss / 2**20, 1),
        peak_pss_tree_mb=round(peak_pss / 2**20, 1),
        max_rss_single_mb=round(max(usage.ru_maxrss if usage else 0, orphans.max_rss_kb) / 1024, 1),
        load_before=round(load_before, 2), load_after=round(os.getloadavg()[0], 2),
    )


# ---------------------------------------------------------------------------------------------
# The floor: bare safe unpickling (run as `triage_scale.py _floor DIR PREFIX`)
# ---------------------------------------------------------------------------------------------
class _RefuseGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def floor_main(folder: Path, prefix: str) -> None:
    """Read and safely unpickle every dump in ``folder`` on one core; print counts and time."""
    files = sorted(p for p in folder.iterdir() if p.name.startswith(prefix))
    started = time.perf_counter()
    total = 0
    for path in files:
        # A buffered file object: the C unpickler then prefetches. Feeding it io.BytesIO makes
        # it read opcode by opcode through Python calls, about 2.5x slower.
        with open(path, "rb") as fh:
            _RefuseGlobals(fh).load()
            total += fh.tell()
    print(json.dumps({"files": len(files), "bytes": total,
                      "seconds": round(time.perf_counter() - started, 3)}))


# ---------------------------------------------------------------------------------------------
# Judging the answers
# ---------------------------------------------------------------------------------------------
def judge_denpex(stdout: Path, stderr: Path, expected: dict[str, Any]) -> dict[str, Any]:
    try:
        result = json.loads(stdout.read_text() or "null")
    except (OSError, json.JSONDecodeError) as exc:
        return {"right": False, "note": f"no JSON on stdout ({exc}); stderr: {_tail(stderr)}"}
    if not isinstance(result, dict):
        return {"right": False, "note": f"no result; stderr: {_tail(stderr)}"}
    culprits = {str(c.get("rank")): c.get("kind") for c in result.get("candidates", [])}
    right = result.get("verdict") == expected["verdict"] and culprits == expected["culprits"]
    shown = dict(list(culprits.items())[:5])
    return {"right": right, "verdict": result.get("verdict"), "culprits": shown,
            "candidates": len(culprits),
            "note": "" if right else f"expected {expected['verdict']} {expected['culprits']}"}


_SET = r"\{([0-9,\s]*)\}"


def judge_torch(stdout: Path, expected: dict[str, Any]) -> dict[str, Any]:
    """What torchfrtrace blamed: 'Culprit rank N', 'missing ranks: {..}', missing dump files."""
    named: set[int] = set()
    gave_up = cannot_decide = 0
    last_error = ""
    try:
        with open(stdout, "r", errors="replace") as fh:
            for line in fh:
                for m in re.finditer(r"Culprit rank (\d+)", line):
                    named.add(int(m.group(1)))
                missing = re.search(r"(?:missing ranks: |Missing dump files from ranks )" + _SET, line)
                if missing:
                    named.update(int(x) for x in missing.group(1).replace(",", " ").split())
                gave_up += "Too many mismatches" in line
                cannot_decide += "We cannot decide" in line
                if re.match(r"\w*(Error|Exception)\b", line):
                    last_error = line.strip()[:200]
    except OSError as exc:
        return {"right": False, "note": f"no output: {exc}"}
    culprits = {int(r) for r in expected["culprits"]}
    right = named == culprits and not last_error
    notes = []
    if gave_up:
        notes.append(f"gave up on {gave_up} group(s) after too many mismatches")
    if cannot_decide:
        notes.append(f"{cannot_decide} 'cannot decide' lines")
    if last_error:
        notes.append(last_error)
    return {"right": right, "named_ranks": len(named), "named_sample": sorted(named)[:8],
            "culprit_named": bool(culprits & named) if culprits else None,
            "note": "; ".join(notes)}


def _tail(path: Path, n: int = 300) -> str:
    try:
        return path.read_text(errors="replace")[-n:].strip().replace("\n", " | ")
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# One size
# ---------------------------------------------------------------------------------------------
@dataclass
class SizeResult:
    ranks: int
    scenario: str
    generation: dict[str, Any] = field(default_factory=dict)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)


def _denpex_argv() -> list[str]:
    script = Path(sys.executable).parent / "denpex"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from denpex.cli import main; main()"]


def _bytes_estimate(ranks: int) -> int:
    # ~360 KB of ring per rank plus the world's rank list in every pg_config.
    return ranks * (380_000 + len(str(list(range(ranks)))))


def run_size(ranks: int, scenario: str, args: argparse.Namespace) -> SizeResult:
    from testkit.generators.expansion import DEFAULT_PREFIX, GeneratedSet, generate_dump_set
    from testkit.generators.fr_template import load_template
    from testkit.generators.gloo_expansion import GlooSet, generate_gloo_set
    from testkit.generators.hang_model import Scenario

    result = SizeResult(ranks, scenario)
    need = _bytes_estimate(ranks)
    free = shutil.disk_usage(args.workdir).free
    if need > free - 2 * 2**30:
        result.generation = {"error": f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} free "
                                      f"in {args.workdir}; pass --workdir on a larger disk"}
        return result
    folder = Path(tempfile.mkdtemp(prefix=f"fr-{ranks}-{scenario}-", dir=args.workdir))
    logs = folder.with_name(folder.name + "-logs")
    logs.mkdir()
    try:
        print(f"[{ranks} ranks, {scenario}] generating ...", flush=True)
        made: GeneratedSet | GlooSet
        if scenario == GLOO:
            made = generate_gloo_set(folder, world_size=ranks, template=load_template(args.template),
                                     ring_size=args.ring)
        else:
            made = generate_dump_set(folder, world_size=ranks, scenario=Scenario(scenario),
                                     template=load_template(args.template), ring_size=args.ring,
                                     workers=args.gen_workers)
        result.generation = {"seconds": round(made.seconds, 2), "files": made.files,
                             "bytes": made.bytes_written, "states": made.states}
        print(f"  generated {made.files} files, {made.bytes_written / 2**30:.2f} GiB in "
              f"{made.seconds:.1f} s", flush=True)
        expected = json.loads((folder / "expected.json").read_text())
        cap = int(args.mem_cap_gb * 2**30)
        for tool in args.tools:
            out, err = logs / f"{tool}.out", logs / f"{tool}.err"
            if tool == "floor":
                argv = [sys.executable, str(Path(__file__).resolve()), "_floor", str(folder),
                        DEFAULT_PREFIX]
                m = measure(argv, timeout_s=args.floor_timeout, mem_cap_bytes=cap,
                            stdout=out, stderr=err)
                verdict: dict[str, Any] = {}
                if m.finished and m.returncode == 0:
                    verdict = {"inner": json.loads(out.read_text())}
                else:
                    verdict = {"note": _tail(err)}
            elif tool == "denpex":
                argv = _denpex_argv() + ["triage", str(folder), "--format", "json"]
                m = measure(argv, timeout_s=args.denpex_timeout, mem_cap_bytes=cap,
                            stdout=out, stderr=err)
                verdict = (judge_denpex(out, err, expected) if m.finished
                           else {"right": False, "note": "did not finish"})
                if m.finished and m.returncode != 0:
                    verdict["note"] = f"exit {m.returncode}: {_tail(err)}"
            else:
                argv = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                        str(folder), "--prefix", DEFAULT_PREFIX, "--allow-incomplete-ranks"]
                env = dict(os.environ, PYTHONUNBUFFERED="1")
                m = measure(argv, timeout_s=args.torch_timeout, mem_cap_bytes=cap, stdout=out,
                            stderr=out.with_suffix(".err"), env=env, output_cap=_OUTPUT_CAP)
                # torch's logger writes to stderr; judge both streams.
                with open(out, "ab") as fh:
                    fh.write(out.with_suffix(".err").read_bytes())
                verdict = judge_torch(out, expected)
                if not m.finished:
                    verdict["right"] = False
                    verdict["note"] = f"did not finish ({m.stop_reason}); " + verdict["note"]
            entry = asdict(m)
            entry.update(verdict)
            result.tools[tool] = entry
            print(f"  {tool}: {m.wall_s:.1f} s, tree RSS peak {m.peak_rss_tree_mb:.0f} MB"
                  f"{'' if m.finished else ' — DID NOT FINISH: ' + m.stop_reason}", flush=True)
        floor = result.tools.get("floor", {})
        if floor.get("finished"):
            for entry in (e for e in result.tools.values() if e["finished"]):
                entry["x_floor"] = round(entry["wall_s"] / floor["wall_s"], 2)
                entry["x_floor_cpu"] = round(entry["cpu_s"] / max(floor["cpu_s"], 0.01), 2)
    finally:
        if args.keep:
            print(f"  kept {folder} and {logs}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(logs, ignore_errors=True)
    return result


# ---------------------------------------------------------------------------------------------
# Table and entry point
# ---------------------------------------------------------------------------------------------
def print_table(results: list[SizeResult]) -> None:
    head = (f"{'ranks':>6} {'scenario':<9} {'tool':<13} {'wall s':>8} {'cpu s':>8} "
            f"{'RSS MB':>8} {'PSS MB':>8} {'x floor':>8} {'x cpu':>6} {'right':>6}  note")
    print("\n" + head + "\n" + "-" * len(head))
    print("(x floor: wall time over the floor's; x cpu: whole-tree CPU time over the floor's.)")
    for r in results:
        gen = r.generation
        if "error" in gen:
            print(f"{r.ranks:>6} {r.scenario:<9} {'-':<13} {gen['error']}")
            continue
        print(f"{r.ranks:>6} {r.scenario:<9} {'generate':<13} {gen.get('seconds', 0):>8.1f} "
              f"{'':>8} {'':>8} {'':>8} {'':>8} {'':>6} {'':>6}  {gen.get('bytes', 0) / 2**30:.2f} GiB")
        for tool, t in r.tools.items():
            wall = f"{t['wall_s']:.1f}" if t["finished"] else f">{t['wall_s']:.0f}"
            right = {True: "yes", False: "NO", None: "-"}[t.get("right")]
            note = t.get("note", "") if t["finished"] else f"did not finish: {t['stop_reason']}"
            if t["finished"] and t["returncode"]:
                note = f"exit {t['returncode']}; {note}"
            if tool == "torchfrtrace" and t["finished"]:
                note = f"named {t.get('named_ranks')} ranks {t.get('named_sample')}; {note}"
            ratio = f"{t['x_floor']:.2f}" if "x_floor" in t else "-"
            cpu_ratio = f"{t['x_floor_cpu']:.2f}" if "x_floor_cpu" in t else "-"
            print(f"{r.ranks:>6} {r.scenario:<9} {tool:<13} {wall:>8} {t['cpu_s']:>8.1f} "
                  f"{t['peak_rss_tree_mb']:>8.0f} {t['peak_pss_tree_mb']:>8.0f} "
                  f"{ratio:>8} {cpu_ratio:>6} {right:>6}  {note[:90]}")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=None,
                   help="comma-separated rank counts (default 512,4096,32768)")
    p.add_argument("--quick", action="store_true",
                   help="256 ranks, every scenario, 120 s cap on torchfrtrace")
    p.add_argument("--scenarios", default=None,
                   help="comma-separated scenarios (hang_model's, and 'gloo') or 'all' (default stalled; "
                        "--quick: all)")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"subset of {','.join(TOOLS)}")
    p.add_argument("--ring", type=int, default=2000, help="entries per rank (default 2000)")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    p.add_argument("--keep", action="store_true", help="keep the generated files and logs")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    p.add_argument("--template", type=Path, default=DEFAULT_TEMPLATE)
    p.add_argument("--gen-workers", type=int, default=2)
    p.add_argument("--floor-timeout", type=float, default=1800)
    p.add_argument("--denpex-timeout", type=float, default=1800)
    p.add_argument("--torch-timeout", type=float, default=None,
                   help="seconds (default 600; --quick: 120)")
    p.add_argument("--mem-cap-gb", type=float, default=8.0,
                   help="kill a program whose process tree RSS exceeds this (default 8)")
    args = p.parse_args(argv)
    from testkit.generators.hang_model import Scenario

    sizes = args.sizes or ",".join(map(str, QUICK_SIZES if args.quick else FULL_SIZES))
    args.sizes = [int(s) for s in sizes.split(",") if s.strip()]
    scenarios = args.scenarios or ("all" if args.quick else "stalled")
    args.scenarios = ([s.value for s in Scenario] + [GLOO] if scenarios == "all"
                      else [s.strip() if s.strip() == GLOO else Scenario(s.strip()).value
                            for s in scenarios.split(",")])
    args.tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = [t for t in args.tools if t not in TOOLS]
    if unknown:
        p.error(f"unknown tools {unknown}; choose from {', '.join(TOOLS)}")
    if args.torch_timeout is None:
        args.torch_timeout = 120 if args.quick else 600
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_floor"]:
        floor_main(Path(argv[1]), argv[2])
        return 0
    args = _parse_args(argv)
    if not become_subreaper():
        print("warning: cannot become a child subreaper; cpu s counts only the processes each "
              "program waited for", file=sys.stderr)
    results: list[SizeResult] = []
    for ranks in args.sizes:
        for scenario in args.scenarios:
            results.append(run_size(ranks, scenario, args))
            if args.out:  # write as we go: a 32k run takes long, keep what is done
                args.out.write_text(json.dumps([asdict(r) for r in results], indent=1))
    print_table(results)
    if args.out:
        print(f"\nresults: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
