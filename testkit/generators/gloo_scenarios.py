"""Real Flight Recorder dumps from 4 real Gloo processes, for every hang Denpex must explain.

    python -m testkit.generators.gloo_scenarios OUT_DIR [--scenario NAME ...] [--timeout-s 5]
                                            [--long-stall NAME|none] [--long-stall-s 35]

Each scenario launches 4 ``torch.distributed`` ranks on CPU (:mod:`testkit.generators.gloo_worker`;
Gloo, FileStore rendezvous) with four process groups besides the world, runs a few steps, then
makes one hang. Every rank runs the product's :class:`~denpex.collector.fr_watchdog.HangDumper`,
which dumps FR (pickle and JSON) at 0.75 x the collective timeout, when a collective raises, or
on request, and makes the other live ranks dump too. Written (``OUT_DIR/.work`` keeps each raw
run: rank logs, store, dump records)::

    OUT_DIR/<scenario>/rank_<r>.pkl    FR pickle of each rank that could dump
    OUT_DIR/<scenario>/rank_<r>.json   the same moment as FR JSON
    OUT_DIR/<scenario>/manifest.json   hosts, pids, dumped_at, process groups (no dump_file:
                                       the rank is the file name's trailing number)
    OUT_DIR/<scenario>/expected.json   the truth: verdict, culprits ({"2": "not_entered"}),
                                       where each rank waits, and how each rank's dump came about
    OUT_DIR/summary.json               per scenario: seconds, who dumped when and why, exit codes

A scenario folder is a triage folder (both encodings of a rank are the same dump; a reader that
wants one encoding copies those files and the manifest).

Process groups (:mod:`testkit.generators.gloo_catalog`), by the names FR records in
``process_group[0]``::

    "0" default_pg [0, 1, 2, 3]   "1" tp [0, 1]   "2" tp [2, 3]   "3" dp [0, 2]   "4" dp [1, 3]

A step is: all_reduce in tp, all_reduce in dp, all_reduce in the world. The hang step differs:

    healthy       every rank steps, then dumps                           -> no_hang
    withheld_one  rank 2 idles; 3 waits in tp "2", 0 in dp "3" (for 2), 1 in dp "4" (for 3)
                                                                         -> localized, 2 not_entered
    withheld_two  ranks 1 and 2 idle; 0 waits in tp "1", 3 in tp "2"     -> localized, 1 and 2 not_entered
    mismatch      rank 3 calls all_gather where 0-2 call all_reduce, world seq 4
                                                                         -> localized, 3 mismatch
    sigkill       rank 1 idles and is SIGKILLed; 0, 2, 3 wait in the world all_reduce
                                                                         -> incomplete, 1 stopped_reporting
    sigstop       the same with rank 2 SIGSTOPped                        -> incomplete, 2 stopped_reporting
    p2p_hang      rank 1 blocks in send to 3, which never receives (Gloo records no p2p in FR);
                  0 waits in tp "1", 3 in dp "4" (for 1), 2 in dp "3" (for 0)
                                                                         -> localized, 1 not_entered

Mismatch: a size or byte-size mismatch makes Gloo SIGABRT the receiver ("op.preamble.length <=
op.nbytes") or close connections within ~1 s, before anyone dumps; a same-byte-size dtype mismatch
(float32 vs int32) completes silently with wrong data. A different op on the same input (all_gather
here; broadcast, reduce and barrier behave alike) hangs every rank until the timeout.

The long stall: ``--long-stall NAME`` also runs scenario NAME as ``NAME_long``, whose ranks do not
dump at 0.75 x timeout. They stay hung past the collective timeout (waiting ranks catch their
failed collective and stay alive, as a job hung in its error handling does) until an operator
style request makes every live rank dump ``--long-stall-s`` seconds after the timeout. Those
dumps are post-exception: whether a failed op reads ``retired=True`` is a race. It runs in parallel with
the short scenarios, which start once it is stalled.

Every rank dies with the generator (PR_SET_PDEATHSIG) and is SIGKILLed with its process group
when its scenario ends, fails or passes its hard time cap.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from denpex.collector import (
    DumpRecord,
    DumpTrigger,
    dump_path,
    rank_identities,
    read_dump_records,
    request_dump,
    write_atomic,
)
from denpex.evidence.manifest import JobManifest, ProcessGroupSpec, RankIdentity
from testkit.services.rank_zygote import RankProcess, rank_launcher
from testkit.generators.gloo_catalog import (
    DUMP_FORMATS,
    SCENARIOS,
    WORLD_SIZE,
    ParentAction,
    Role,
    Scenario,
    SignalKind,
    expected_waits,
    group_names,
    host_name,
)

__all__ = [
    "SCENARIOS",
    "WORK_DIR",
    "GeneratorOptions",
    "ScenarioError",
    "ScenarioRun",
    "run_scenario",
    "run_scenarios",
    "main",
]

LONG_SUFFIX = "_long"
WORK_DIR = ".work"
WORKER_MODULE = "testkit.generators.gloo_worker"

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GeneratorOptions:
    """How the scenarios run. The defaults take about 1.5 minutes on 2 cores."""

    timeout_s: float = 5.0
    steps: int = 2
    long_stall: str | None = "withheld_one"
    long_stall_s: float = 35.0
    fr_buffer_size: int = 64
    cap_s: float = 120.0
    attempts: int = 2


class ScenarioError(RuntimeError):
    """A scenario did not produce the evidence it promises; the message says what and where."""


@dataclass(frozen=True)
class ScenarioRun:
    """The outcome of one scenario, as written to ``summary.json``."""

    name: str
    seconds: float
    attempts: int
    detail: dict[str, object]

    @property
    def triggers(self) -> dict[int, str]:
        ranks: dict[int, dict[str, object]] = self.detail["ranks"]  # type: ignore[assignment]
        return {r: str(v["trigger"]) for r, v in ranks.items() if "trigger" in v}


def run_scenarios(out_dir: Path, names: Sequence[str], options: GeneratorOptions) -> list[ScenarioRun]:
    """Run the scenarios (and the long-stall variant) into ``out_dir``; write ``summary.json``."""
    unknown = [n for n in [*names, *([options.long_stall] if options.long_stall else [])]
               if n not in SCENARIOS]
    if unknown:
        raise ScenarioError(f"unknown scenario(s) {unknown}; choose from {sorted(SCENARIOS)}")
    started = time.monotonic()
    abort = threading.Event()
    runs: list[ScenarioRun] = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="long-stall") as pool:
        long_run = None
        try:
            if options.long_stall:
                # Mostly idle for timeout + long_stall_s: overlap it with the short ones, which
                # start once its ranks are stalled so that its start-up does not slow theirs.
                stalled = threading.Event()
                long_run = pool.submit(run_scenario, out_dir, SCENARIOS[options.long_stall],
                                       options, long_stall=True, on_hang=stalled.set, abort=abort)
                stalled.wait(options.cap_s)
            runs += [run_scenario(out_dir, SCENARIOS[n], options, abort=abort) for n in names]
            if long_run is not None:
                runs.append(long_run.result())
        except BaseException:
            abort.set()
            raise
    summary = {"total_seconds": round(time.monotonic() - started, 1), "options": asdict(options),
               "scenarios": {r.name: {"seconds": r.seconds, "attempts": r.attempts, **r.detail}
                             for r in runs}}
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=1, default=str).encode())
    return runs


def run_scenario(out_dir: Path, scenario: Scenario, options: GeneratorOptions, *,
                 long_stall: bool = False, on_hang: Callable[[], None] | None = None,
                 abort: threading.Event | None = None) -> ScenarioRun:
    """Run one scenario into ``out_dir/<name>``, retrying a run that missed its timing."""
    name = scenario.name + (LONG_SUFFIX if long_stall else "")
    started = time.monotonic()
    errors: list[str] = []
    try:
        for attempt in range(1, options.attempts + 1):
            run = _Attempt(out_dir, name, scenario, options, long_stall, on_hang,
                           abort or threading.Event())
            try:
                detail = run.execute()
            except ScenarioError as exc:
                errors.append(f"attempt {attempt}: {exc}")
                _log.warning("%s: attempt %d failed: %s", name, attempt, exc)
                if run.abort.is_set():
                    break
                continue
            return ScenarioRun(name, round(time.monotonic() - started, 1), attempt, detail)
    finally:
        if on_hang is not None:
            on_hang()  # never leave a waiter hanging on a run that failed early
    raise ScenarioError(f"{name} failed {len(errors)} time(s):\n" + "\n".join(errors))


class _Attempt:
    """One launch of a scenario's 4 ranks: act on them, collect their dumps, assemble the output."""

    def __init__(self, out_dir: Path, name: str, scenario: Scenario, options: GeneratorOptions,
                 long_stall: bool, on_hang: Callable[[], None] | None, abort: threading.Event) -> None:
        self.out_dir = out_dir
        self.name = name
        self.scenario = scenario
        self.options = options
        self.long_stall = long_stall
        self.on_hang = on_hang
        self.abort = abort
        self.work = out_dir / WORK_DIR / name
        self.cap_s = options.cap_s + (options.timeout_s + options.long_stall_s if long_stall else 0)
        self.deadline = time.monotonic() + self.cap_s
        self.procs: list[RankProcess] = []
        self.signal_store: Any = None
        """The TCPStore this generator serves for a STORE-signal scenario; alive as long as the ranks."""

    def execute(self) -> dict[str, object]:
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(self.out_dir / self.name, ignore_errors=True)
        (self.work / "markers").mkdir(parents=True)
        detail: dict[str, object] = {"timeout_s": self.options.timeout_s,
                                     "long_stall": self.long_stall, "cap_s": self.cap_s}
        try:
            self._launch()
            entered = self._wait_markers("hang")
            hang_started = max(entered.values())
            detail["hang_started_at"] = hang_started.isoformat()
            if self.on_hang is not None:
                self.on_hang()
            self._act()
            if self.long_stall:
                self._request_late(hang_started)
                detail["dump_requested_at"] = datetime.now(UTC).isoformat()
            records = self._wait_records(set(range(WORLD_SIZE)) - self.scenario.silent_ranks)
            if not self.long_stall:
                self._check_before_timeout(records, entered)
            if self.scenario.default_role is Role.FINISH:
                self._wait_clean_exit()
        finally:
            exits = self._kill_all()
            self.signal_store = None  # the last reference: stops its server
        detail["dump_signal"] = self.scenario.dump_signal.value
        detail["ranks"] = {
            r: {"pid": self.procs[r].pid, "exit": exits[r], **(
                {"trigger": rec.trigger.value, "reason": rec.reason,
                 "dumped_at": rec.dumped_at.isoformat(), "dump_seconds": rec.dump_seconds}
                if (rec := records.get(r)) else {})}
            for r in range(WORLD_SIZE)}
        if self.long_stall:
            first = min(rec.dumped_at for rec in records.values())
            detail["stall_seconds_past_timeout"] = round(
                (first - hang_started).total_seconds() - self.options.timeout_s, 1)
        self._assemble(records)
        return detail

    def _launch(self) -> None:
        repo_root = Path(__file__).resolve().parents[2]  # testkit/ is imported from the repo root
        env = {**os.environ,
               "TORCH_FR_BUFFER_SIZE": str(self.options.fr_buffer_size),
               "OMP_NUM_THREADS": "1",
               # Loopback only: a CI machine's host name may resolve to an unreachable address.
               "GLOO_SOCKET_IFNAME": "lo",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(repo_root),
                                                           os.environ.get("PYTHONPATH")]))}
        signal_args = self._serve_signal_store()
        launcher = rank_launcher()
        for rank in range(WORLD_SIZE):
            args = ["--rank", str(rank), *signal_args,
                    "--work-dir", str(self.work), "--scenario", self.scenario.name,
                    "--timeout-s", str(self.options.timeout_s), "--steps", str(self.options.steps),
                    "--parent-pid", str(launcher.pid), *(["--long-stall"] if self.long_stall else [])]
            # Forked from the zygote, in a session per rank: one killpg takes the rank and anything it started.
            self.procs.append(launcher.spawn(WORKER_MODULE, args, env=env, cwd=Path.cwd(),
                                             log=self.work / f"rank_{rank}.log"))

    def _serve_signal_store(self) -> list[str]:
        """For a STORE-signal scenario, serve the TCPStore the ranks send dump requests through."""
        if self.scenario.dump_signal is not SignalKind.STORE:
            return []
        import torch.distributed as dist

        self.signal_store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                          timeout=timedelta(seconds=self.cap_s))
        return ["--signal-store", f"127.0.0.1:{self.signal_store.port}"]

    def _act(self) -> None:
        target = self.scenario.target
        if self.scenario.action is ParentAction.NONE or target is None:
            return
        # Each marker is written just before its rank calls the op: let the calls block first.
        time.sleep(0.5)
        sig = signal.SIGKILL if self.scenario.action is ParentAction.SIGKILL else signal.SIGSTOP
        os.kill(self.procs[target].pid, sig)

    def _request_late(self, hang_started: datetime) -> None:
        # Hang past the collective timeout, then ask as an operator would.
        stall = self.options.timeout_s + self.options.long_stall_s
        when = hang_started + timedelta(seconds=stall)
        while datetime.now(UTC) < when:
            self._check("the long stall to pass")
            time.sleep(0.2)
        request_dump(self.work / "collected", f"job stalled {self.options.long_stall_s:.0f}s past "
                     f"the {self.options.timeout_s:g}s collective timeout", requested_by="operator")

    def _wait_markers(self, phase: str) -> dict[int, datetime]:
        markers = {r: self.work / "markers" / f"{phase}-{r}" for r in range(WORLD_SIZE)}
        while not all(m.exists() for m in markers.values()):
            self._check(f"every rank reaching '{phase}'", alive=True)
            time.sleep(0.05)
        return {r: datetime.fromisoformat(m.read_text()) for r, m in markers.items()}

    def _check_before_timeout(self, records: dict[int, DumpRecord], entered: dict[int, datetime]) -> None:
        """A stall or request dump must precede the rank's collective timeout: after it, the
        failed op's ``retired`` flag is a race and the dump no longer shows the hang as it was."""
        timeout = timedelta(seconds=self.options.timeout_s)
        late = {r: round((rec.dumped_at - entered[r]).total_seconds(), 2) for r, rec in records.items()
                if rec.trigger in (DumpTrigger.STALL, DumpTrigger.REQUEST)
                and rec.dumped_at >= entered[r] + timeout}
        if late:
            raise ScenarioError(f"{self.name}: ranks dumped only after the {timeout.total_seconds():g}s "
                                f"timeout (seconds after entering: {late}); the machine is too "
                                "loaded for this --timeout-s")

    def _wait_records(self, expected: set[int]) -> dict[int, DumpRecord]:
        collected = self.work / "collected"
        records = read_dump_records(collected)
        while not expected <= set(records):
            self._check(f"ranks {sorted(expected - set(records))} to dump")
            time.sleep(0.1)
            records = read_dump_records(collected)
        if set(records) - expected:
            raise ScenarioError(f"{self.name}: ranks {sorted(set(records) - expected)} dumped, "
                                "but the generator killed or stopped them")
        for rank in records:
            for fmt in DUMP_FORMATS:
                if not dump_path(collected, rank, fmt).is_file():
                    raise ScenarioError(f"{self.name}: rank {rank} wrote no {fmt.value} dump")
        return records

    def _wait_clean_exit(self) -> None:
        for rank, proc in enumerate(self.procs):
            try:
                rc = proc.wait(max(0.1, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired as exc:
                raise ScenarioError(f"{self.name}: rank {rank} did not exit; see "
                                    f"{self.work}/rank_{rank}.log") from exc
            if rc != 0:
                raise ScenarioError(f"{self.name}: rank {rank} exited with {rc}; see "
                                    f"{self.work}/rank_{rank}.log")

    def _check(self, waiting_for: str, *, alive: bool = False) -> None:
        where = f"see {self.work}/rank_*.log"
        if self.abort.is_set():
            raise ScenarioError(f"{self.name}: aborted while waiting for {waiting_for}")
        if time.monotonic() > self.deadline:
            raise ScenarioError(f"{self.name}: passed its {self.cap_s:.0f}s cap waiting for "
                                f"{waiting_for}; {where}")
        dead = {r: p.returncode for r, p in enumerate(self.procs) if p.poll() is not None}
        if alive and dead:
            raise ScenarioError(f"{self.name}: ranks exited before {waiting_for}: {dead}; {where}")

    def _kill_all(self) -> dict[int, int | str]:
        """SIGKILL every rank's process group (stopped ones too) and reap it."""
        exits: dict[int, int | str] = {}
        for rank, proc in enumerate(self.procs):
            rc = proc.poll()
            if rc is not None:
                exits[rank] = rc
                continue
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            code = proc.wait()
            exits[rank] = "killed at the end" if code == -signal.SIGKILL else code
        if self.scenario.action is ParentAction.SIGKILL and self.scenario.target is not None \
                and self.scenario.target in exits:
            exits[self.scenario.target] = "SIGKILLed as the scenario's fault"
        return exits

    def _assemble(self, records: dict[int, DumpRecord]) -> None:
        dest = self.out_dir / self.name
        dest.mkdir(parents=True)
        collected = self.work / "collected"
        for rank in records:
            for fmt in DUMP_FORMATS:
                src = dump_path(collected, rank, fmt)
                shutil.copyfile(src, dest / src.name)
        launched = {r: RankIdentity(host=host_name(r), local_rank=0, pid=p.pid)
                    for r, p in enumerate(self.procs)}
        manifest = JobManifest(job_id=f"gloo-{self.name}", world_size=WORLD_SIZE,
                               ranks=rank_identities(records.values(), launched),
                               process_groups=self._process_groups())
        write_atomic(dest / "manifest.json",
                     manifest.model_dump_json(indent=1, exclude_none=True).encode())
        expected = {"scenario": self.name, "description": self.scenario.description,
                    "verdict": self.scenario.verdict.value,
                    "culprits": {str(r): k.value for r, k in sorted(self.scenario.culprits.items())},
                    "waiting": {str(r): asdict(w) for r, w in
                                sorted(expected_waits(self.scenario, self.options.steps).items())},
                    # How each rank's dump came about: "error" and long-stall dumps were taken after
                    # the rank's collective raised, so their last op may read retired=True.
                    "dump_triggers": {str(r): rec.trigger.value for r, rec in sorted(records.items())},
                    "timeout_s": self.options.timeout_s, "long_stall": self.long_stall}
        write_atomic(dest / "expected.json", json.dumps(expected, indent=1).encode())

    def _process_groups(self) -> dict[str, ProcessGroupSpec]:
        """Every group as the ranks themselves named it (a killed rank wrote its file at start)."""
        groups: dict[str, ProcessGroupSpec] = {}
        for rank in range(WORLD_SIZE):
            for name, spec in json.loads((self.work / f"groups-{rank}.json").read_text()).items():
                groups[name] = ProcessGroupSpec(desc=spec["desc"], ranks=tuple(spec["ranks"]))
        named = {spec.ranks: name for name, spec in groups.items()}
        if named != group_names():
            # expected_waits() and the docs assume this naming; a torch upgrade may change it.
            raise ScenarioError(f"{self.name}: FR named the groups {named}, expected {group_names()}")
        return dict(sorted(groups.items(), key=lambda kv: int(kv[0])))


def _parser() -> argparse.ArgumentParser:
    d = GeneratorOptions()
    p = argparse.ArgumentParser(prog="python -m testkit.generators.gloo_scenarios",
                                description="Write real Gloo Flight Recorder dumps per hang scenario.")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                   help="run only these (repeatable); default: all")
    p.add_argument("--timeout-s", type=float, default=d.timeout_s, help="collective timeout (>= 2)")
    p.add_argument("--steps", type=int, default=d.steps, help="healthy steps before the hang")
    p.add_argument("--long-stall", default=d.long_stall,
                   help="also run this scenario as NAME_long, hung past the timeout; or 'none'")
    p.add_argument("--long-stall-s", type=float, default=d.long_stall_s,
                   help="how long past the collective timeout the long stall lasts")
    p.add_argument("--fr-buffer-size", type=int, default=d.fr_buffer_size,
                   help="TORCH_FR_BUFFER_SIZE: FR entries kept per rank")
    p.add_argument("--cap-s", type=float, default=d.cap_s, help="hard time cap per scenario")
    p.add_argument("--attempts", type=int, default=d.attempts)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    long_stall = None if args.long_stall in (None, "", "none") else args.long_stall
    if long_stall is not None and long_stall not in SCENARIOS:
        parser.error(f"--long-stall {long_stall!r}: choose one of {sorted(SCENARIOS)} or 'none'")
    if args.timeout_s < 2:
        parser.error(f"--timeout-s {args.timeout_s}: below 2 s the dumps race the timeout")
    if args.attempts < 1:
        parser.error(f"--attempts {args.attempts}: must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    options = GeneratorOptions(timeout_s=args.timeout_s, steps=args.steps, long_stall=long_stall,
                               long_stall_s=args.long_stall_s, fr_buffer_size=args.fr_buffer_size,
                               cap_s=args.cap_s, attempts=args.attempts)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    try:
        runs = run_scenarios(args.out_dir, args.scenario or list(SCENARIOS), options)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for run in runs:
        print(f"{run.name:18s} {run.seconds:6.1f}s  attempts={run.attempts}  dumped={run.triggers}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
