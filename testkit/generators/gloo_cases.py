"""Real Gloo reproductions of the triage-accuracy families (issue 9), with their ground truth.

    python -m testkit.generators.gloo_cases OUT_DIR [--case NAME ...] [--timeout-s 6]

Each case launches 4 real ``torch.distributed`` Gloo ranks
(:mod:`testkit.generators.gloo_case_worker`) that run two world all_reduces under the product's
``HangDumper``, then play the case. The first rank blocked for 0.75 x the collective timeout dumps
and asks the others to dump (``slow_rank`` is asked by the launcher after about one second
instead). Written::

    OUT_DIR/<case>/rank_<r>.pkl             the evidence folder triage is run on (no manifest)
    OUT_DIR/<case>/expected.json            the truth: verdict, culprits, stale ranks
    OUT_DIR/.work/<case>/collected/         what HangDumper wrote: dumps plus collector/ records
    OUT_DIR/.work/<case>/rank_<r>.log       each rank's log

Process groups: ``"0"`` the world ``[0, 1, 2, 3]``, ``"1"`` the pair ``[0, 1]``; issue 17's cases
add their own (``gloo_case_worker.EXTRA_GROUPS``): ``pairs_on_demand`` ``"2"`` = ``[2, 3]``,
``overlap_retire_race`` ``"2"`` = ``[1, 2]`` and ``"3"`` = ``[2, 3]``. Their folders hold the dumps
each rank took itself right after its last call (``old_dumps``), as an on-demand dump catches a
running job; ``restart_withheld`` rebuilds the default group in the same processes first.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from denpex.analysis.models import CandidateKind, Verdict
from denpex.collector import read_dump_records, request_dump, write_atomic
from testkit.services.rank_zygote import RankProcess, rank_launcher

__all__ = ["GlooCase", "CASES", "CaseError", "EXPECTED_NAME", "WORK_DIR", "run_case", "run_cases", "main"]

WORLD_SIZE = 4
WORK_DIR = ".work"
EXPECTED_NAME = "expected.json"
WORKER_MODULE = "testkit.generators.gloo_case_worker"

_log = logging.getLogger(__name__)

NE, MM, SR = CandidateKind.NOT_ENTERED, CandidateKind.MISMATCH, CandidateKind.STOPPED_REPORTING
ST = CandidateKind.STALLED


@dataclass(frozen=True)
class GlooCase:
    """One reproduction and the triage answer its evidence folder must get."""

    name: str
    family: int
    description: str
    verdict: Verdict
    culprits: dict[int, CandidateKind]
    stale: tuple[int, ...] = ()
    # Ranks the triage names that are not culprits: low-confidence suspects named only through a
    # guessed membership (issue 17, family 4). A healthy job can have them.
    suspects: dict[int, CandidateKind] = field(default_factory=dict)
    # The named ranks (culprits or suspects) whose candidate says ``"membership": "inferred"``.
    inferred: tuple[int, ...] = ()
    # The race an on-demand dump catches decides which ops a live run shows still in flight (the
    # committed dumps show the answer above). Where it leaves a whole group's last op in flight on
    # every member that mentions it (on a loaded machine it can), no peer retired it and no age is
    # known, so the honest answer is ``incomplete`` naming ranks only as guessed-membership suspects,
    # never ``no_hang`` (issue 17, families 3 and 4). A live run must say one of the two.
    on_demand_race: bool = False
    # Seconds after every rank reached the case before the launcher asks for dumps (None: the
    # ranks' own stall trigger at 0.75 x timeout).
    request_after_s: float | None = None
    # Ranks whose folder dump is the old one the rank took mid-run, not its final dump.
    old_dumps: tuple[int, ...] = field(default=())
    # Ranks whose final JSON dump lies beside their (old) pickle: two encodings, two moments.
    json_twins: tuple[int, ...] = field(default=())
    # A program run to its hang first, as an earlier attempt of the same job; these ranks' dumps
    # come from it (they did not dump again in the newest attempt).
    previous_attempt: str | None = None
    from_previous: tuple[int, ...] = field(default=())

    def expected(self) -> dict[str, object]:
        """The truth, as written to ``expected.json`` beside the dumps."""
        return {"case": self.name, "family": self.family, "description": self.description,
                "verdict": self.verdict.value,
                "culprits": {str(r): k.value for r, k in sorted(self.culprits.items())},
                "stale_ranks": list(self.stale),
                **({"suspects": {str(r): k.value for r, k in sorted(self.suspects.items())}}
                   if self.suspects else {}),
                **({"inferred": list(self.inferred)} if self.inferred else {})}


CASES: dict[str, GlooCase] = {c.name: c for c in (
    GlooCase("gather_skip", 1, "ranks 0-2 call gather(dst=0), only rank 0 passes gather_list; "
             "rank 3 never calls it", Verdict.LOCALIZED, {3: NE}),
    GlooCase("scatter_skip", 1, "ranks 0, 1, 3 call scatter(src=0), only rank 0 passes "
             "scatter_list; rank 2 never calls it", Verdict.LOCALIZED, {2: NE}),
    GlooCase("all_to_all_single_skip", 1, "ranks 0, 2, 3 call all_to_all_single with uneven splits "
             "(every rank's sizes differ); rank 1 never calls it", Verdict.LOCALIZED, {1: NE}),
    GlooCase("stale_dump", 2, "rank 2's dump is an old periodic one taken 4 collectives before the "
             "hang; rank 1 never enters the world all_reduce", Verdict.INCOMPLETE, {1: NE, 2: SR},
             stale=(2,), old_dumps=(2,)),
    GlooCase("twins_differ", 3, "rank 2's pickle is its old periodic dump, its JSON the final one "
             "(4 collectives later); rank 1 never enters the world all_reduce", Verdict.LOCALIZED,
             {1: NE}, old_dumps=(2,), json_twins=(2,)),
    GlooCase("restarted", 3, "the job hung (rank 1 idle in the world all_reduce #7) and was "
             "restarted; in the new attempt rank 3 never calls gather(dst=0) and leaves no dump, so "
             "its file is the one from the first attempt", Verdict.INCOMPLETE, {3: SR},
             previous_attempt="stale_dump", from_previous=(3,)),
    GlooCase("mismatch_and_skip", 4, "ranks 0, 1 call all_reduce, rank 3 all_gather at the same "
             "world seq; rank 2 never calls", Verdict.LOCALIZED, {2: NE, 3: MM}),
    GlooCase("tie_and_skip", 4, "rank 0 calls all_reduce, rank 1 all_gather at the same world seq; "
             "ranks 2 and 3 never call, and their calls would decide the majority",
             Verdict.INCOMPLETE, {0: MM, 1: MM, 2: NE, 3: NE}),
    GlooCase("subgroup_unknown", 5, "rank 0 waits in the pair [0, 1]'s all_reduce, which rank 1 "
             "never calls; ranks 2, 3 wait in the world all_reduce. Without a manifest the pair "
             "looks like a one-member group", Verdict.INCOMPLETE, {1: NE}),
    GlooCase("subgroup_skipped", 5, "rank 0 waits in the pair [0, 1]'s all_reduce; rank 1 skips it "
             "and waits in the world all_reduce with ranks 2, 3. Without a manifest the pair looks "
             "like a one-member group and rank 1 is not idle; Gloo's pg_config shows that rank 1 "
             "built a subgroup and ranks 2, 3 did not, so rank 1 is the pair's other member. Ranks 0 "
             "and 1 wait on each other: either could be out of program order. Rank 1's membership of "
             "the pair is that guess (issue 17 family 4)",
             Verdict.INCOMPLETE, {0: ST, 1: ST}, inferred=(1,)),
    GlooCase("world_wrapped", 5, "ranks 0 and 1 run 70 all_reduces in the pair, which wraps their "
             "64-entry rings past every world entry; then ranks 0, 2, 3 wait in the world all_reduce "
             "and rank 1 never calls it. Rank 1's dump holds no world entry; its pg_status for the "
             "default group (pg_id 0) still tells how far it got there",
             Verdict.LOCALIZED, {1: NE}),
    GlooCase("slow_rank", 6, "rank 3 has not called the world all_reduce yet when everyone is asked "
             "to dump, one second in: as likely slow as hung", Verdict.LOCALIZED, {3: NE},
             request_after_s=1.0),
    # Issue 17's families 4-6 (family 17 here: issue 9 numbered 1-6).
    GlooCase("pairs_on_demand", 17, "issue 17 family 4: healthy; ranks 0, 1 run all_reduces in the "
             "pair [0, 1] and ranks 2, 3 in the pair [2, 3]; everyone is dumped on demand right after "
             "its last call, which ranks 2, 3 still have in flight (no dump time, no manifest). Only "
             "ranks 2, 3 mention their pair, so its other members look unknown; Gloo's pg_config "
             "shows that ranks 0, 1 built a subgroup, which is not this one", Verdict.INCOMPLETE, {},
             suspects={0: NE, 1: NE}, inferred=(0, 1), request_after_s=2.0, old_dumps=(0, 1, 2, 3),
             on_demand_race=True),
    GlooCase("overlap_retire_race", 17, "issue 17 family 5: healthy; overlapping pairs [0, 1], "
             "[1, 2], [2, 3] run all_reduces in one order and each rank dumps right after its last "
             "op returned: a member's last op reads retired=False while its peer retired it",
             Verdict.NO_HANG, {}, request_after_s=1.0, old_dumps=(0, 1, 2, 3), on_demand_race=True),
    GlooCase("restart_withheld", 17, "issue 17 family 6: the default group runs 8 all_reduces, is "
             "destroyed and built again in the same processes; in the new incarnation ranks 0, 2, 3 "
             "wait in all_reduce #4 and rank 1 never calls it. The ring holds both incarnations, "
             "and the old one's seq ids pass the new stuck op's", Verdict.LOCALIZED, {1: NE}),
)}


class CaseError(RuntimeError):
    """A case did not produce the evidence it promises; the message says what and where."""


def run_cases(out_dir: Path, names: Sequence[str], *, timeout_s: float = 6.0, parallel: int = 2,
              cap_s: float = 150.0) -> dict[str, Path]:
    """Run the cases (``parallel`` at a time) into ``out_dir``; case name -> evidence folder."""
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise CaseError(f"unknown case(s) {unknown}; choose from {sorted(CASES)}")
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {n: pool.submit(run_case, out_dir, CASES[n], timeout_s=timeout_s, cap_s=cap_s)
                   for n in names}
        return {n: f.result() for n, f in futures.items()}


def run_case(out_dir: Path, case: GlooCase, *, timeout_s: float = 6.0, cap_s: float = 150.0,
             attempts: int = 2) -> Path:
    """Run one case into ``out_dir/<name>``, retrying once a run the loaded machine spoiled."""
    errors = []
    for attempt in range(1, attempts + 1):
        try:
            return _Run(out_dir, case, timeout_s, cap_s).execute()
        except CaseError as exc:
            errors.append(f"attempt {attempt}: {exc}")
            _log.warning("%s: attempt %d failed: %s", case.name, attempt, exc)
    raise CaseError(f"{case.name} failed:\n" + "\n".join(errors))


class _Run:
    def __init__(self, out_dir: Path, case: GlooCase, timeout_s: float, cap_s: float) -> None:
        self.case = case
        self.dest = out_dir / case.name
        self.work = out_dir / WORK_DIR / case.name
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + cap_s
        self.procs: list[RankProcess] = []

    def execute(self) -> Path:
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(self.dest, ignore_errors=True)
        (self.work / "markers").mkdir(parents=True)
        if self.case.previous_attempt is not None:
            self._attempt(self.work / "previous", self.case.previous_attempt, None)
        self._attempt(self.work, self.case.name, self.case.request_after_s)
        self.dest.mkdir(parents=True)
        for rank in range(WORLD_SIZE):
            for src, name in self._files_of(rank):
                if not src.is_file():
                    raise CaseError(f"{self.case.name}: rank {rank} wrote no {src}")
                shutil.copyfile(src, self.dest / name)
        write_atomic(self.dest / EXPECTED_NAME, json.dumps(self.case.expected(), indent=1).encode())
        return self.dest

    def _attempt(self, work: Path, program: str, request_after_s: float | None) -> None:
        """Launch the 4 ranks of ``program`` in ``work``, let them hang and dump, kill them."""
        (work / "markers").mkdir(parents=True, exist_ok=True)
        self.procs = []
        try:
            self._launch(work, program)
            self._wait(lambda: all((work / "markers" / f"hang-{r}").exists()
                                   for r in range(WORLD_SIZE)), "every rank reaching the case", work)
            if request_after_s is not None:
                time.sleep(request_after_s)
                request_dump(work / "collected", "launcher: dump now", requested_by="launcher")
            self._wait(lambda: len(read_dump_records(work / "collected")) == WORLD_SIZE,
                       "every rank to dump", work)
        finally:
            self._kill_all()
        self._check_before_timeout(work)

    def _files_of(self, rank: int) -> list[tuple[Path, str]]:
        """Where the folder's files of ``rank`` come from, and their names there."""
        final = self.work / "collected"
        if rank in self.case.from_previous:
            return [(self.work / "previous" / "collected" / f"rank_{rank}.pkl", f"rank_{rank}.pkl")]
        pickle_dir = self.work / "old" if rank in self.case.old_dumps else final
        files = [(pickle_dir / f"rank_{rank}.pkl", f"rank_{rank}.pkl")]
        if rank in self.case.json_twins:
            files.append((final / f"rank_{rank}.json", f"rank_{rank}.json"))
        return files

    def _launch(self, work: Path, program: str) -> None:
        repo_root = Path(__file__).resolve().parents[2]  # testkit/ is imported from the repo root
        env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "64", "OMP_NUM_THREADS": "1",
               "GLOO_SOCKET_IFNAME": "lo",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(repo_root),
                                                           os.environ.get("PYTHONPATH")]))}
        launcher = rank_launcher()
        for rank in range(WORLD_SIZE):
            args = ["--rank", str(rank), "--world-size", str(WORLD_SIZE), "--work-dir", str(work),
                    "--case", program, "--timeout-s", str(self.timeout_s), "--parent-pid", str(launcher.pid)]
            self.procs.append(launcher.spawn(WORKER_MODULE, args, env=env, cwd=Path.cwd(),
                                             log=work / f"rank_{rank}.log"))

    def _wait(self, done: Callable[[], bool], what: str, work: Path) -> None:
        while not done():
            if time.monotonic() > self.deadline:
                raise CaseError(f"{self.case.name}: timed out waiting for {what}; see {work}/rank_*.log")
            dead = {r: p.returncode for r, p in enumerate(self.procs) if p.poll() is not None}
            if dead:
                raise CaseError(f"{self.case.name}: ranks exited while waiting for {what}: {dead}; "
                                f"see {work}/rank_*.log")
            time.sleep(0.05)

    def _check_before_timeout(self, work: Path) -> None:
        """Every dump must precede the first timeout: after it, Gloo's failed ops are a race."""
        records = read_dump_records(work / "collected")
        first = min(r.dumped_at for r in records.values())
        last = max(r.dumped_at for r in records.values())
        if (last - first).total_seconds() > self.timeout_s * 0.2:
            raise CaseError(f"{self.case.name}: the dumps spread over {(last - first).total_seconds():.1f} s; "
                            "the machine is too loaded for this --timeout-s")

    def _kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testkit.generators.gloo_cases")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--case", action="append", choices=sorted(CASES))
    p.add_argument("--timeout-s", type=float, default=6.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        folders = run_cases(args.out_dir, args.case or list(CASES), timeout_s=args.timeout_s)
    except CaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, folder in folders.items():
        print(f"{name:24s} {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
