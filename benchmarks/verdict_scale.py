"""The verdict at scale: ``decide`` when thousands of candidates' rings wrapped past their group.

Gloo. Half the ranks wait in world #6; the other half's rings hold only another group's entries,
so each is a candidate whose reason reads its own ``pg_status`` (``progress_from_status``: Gloo's
default group, a count below #6). That look-up reads the candidate's own dump only, so the
verdict is linear in the candidates.

    .venv/bin/python benchmarks/verdict_scale.py --ranks 4000 8000 16000 --repeat 3

Prints the median and best wall time of ``decide`` per size.
"""

from __future__ import annotations

import argparse
import statistics
import time

from denpex.analysis.compare import Blockage, BlockageKind, Comparison
from denpex.analysis.membership import GroupMembership
from denpex.analysis.summary import GroupProgress, RankSummary
from denpex.analysis.verdict import decide
from denpex.evidence.fr_dump import DumpEncoding


def build(n: int) -> tuple[Comparison, dict[int, RankSummary]]:
    summaries = {}
    half = n // 2
    for rank in range(n):
        if rank < half:
            groups = {"0": GroupProgress(name="0", pg_id=0, last_enqueued=6, last_completed=5, entry_count=6)}
            summaries[rank] = RankSummary(rank=rank, source="x", encoding=DumpEncoding.PICKLE, version="2.10",
                                          backend="gloo", groups=groups)
        else:
            groups = {"1": GroupProgress(name="1", pg_id=1, last_enqueued=20, last_completed=20, entry_count=20)}
            summaries[rank] = RankSummary(rank=rank, source="x", encoding=DumpEncoding.PICKLE, version="2.10",
                                          backend="gloo", ring_wrapped=True, groups=groups,
                                          pg_status={0: (5, 5), 1: (20, 20)})
    blockage = Blockage("0", 6, BlockageKind.BEHIND, "gloo:all_reduce", tuple(range(half)), tuple(range(half, n)))
    return Comparison(blockages=[blockage]), summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4000, 8000, 16000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for n in args.ranks:
        comparison, summaries = build(n)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            decision = decide(comparison, summaries, {}, GroupMembership(), None)
            times.append(time.perf_counter() - start)
        print(f"{n:>6} ranks, {len(decision.candidates):>5} candidates: median "
              f"{statistics.median(times) * 1000:.0f} ms, best {min(times) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
