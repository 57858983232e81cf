"""The wait graph's condensation at scale: ``find_culprits`` on synthetic wait graphs.

Times the SCC step alone (no dumps, no parsing) on graphs shaped like the hangs it must explain:

- ``chain``: rank i waits on rank i+1 (the deepest graph: a recursive SCC would overflow);
- ``world_tie``: every rank in one all-in op, one rank whose CPU stopped there (the refinement
  condenses a 32,768-rank component a second time);
- ``moe``: expert groups of 8 all stuck in an all_to_all with one stopped member each, dp groups
  waiting on them, pipeline p2p waits between stages (many small cycles).

    .venv/bin/python benchmarks/scc_scale.py --ranks 32768 --repeat 5

Prints the median and best wall time per shape, with the graph's node and edge counts.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from denpex.analysis.compare import Blockage, BlockageKind
from denpex.analysis.waitgraph import find_culprits


def chain(n: int) -> list[Blockage]:
    return [Blockage(f"c{i}", 1, BlockageKind.BEHIND, "op", (i,), (i + 1,)) for i in range(n - 1)]


def world_tie(n: int) -> list[Blockage]:
    ranks = tuple(range(n))
    return [Blockage("0", 9, BlockageKind.OVERDUE, "op", ranks, ranks, tie=True),
            Blockage("0", 9, BlockageKind.STOPPED, "op", ranks[1:], (0,))]


def moe(n: int, ep: int = 8) -> list[Blockage]:
    out: list[Blockage] = []
    for start in range(0, n, ep):
        group = tuple(range(start, min(start + ep, n)))
        out.append(Blockage(f"ep{start}", 5, BlockageKind.OVERDUE, "a2a", group, group, tie=True))
        if len(group) > 1:
            out.append(Blockage(f"ep{start}", 5, BlockageKind.STOPPED, "a2a", group[1:], group[:1]))
    half = n // 2
    for rank in range(half):  # stage 1 waits on stage 0 in p2p; stage 0's dp waits on stage 1
        out.append(Blockage("0", 3, BlockageKind.P2P, "recv", (rank + half,), (rank,), is_p2p=True))
    for start in range(half, n, ep):
        out.append(Blockage(f"dp{start}", 4, BlockageKind.BEHIND, "rs", (start - half,), (start,)))
    return out


def measure(build: Callable[[int], list[Blockage]], n: int, repeat: int) -> tuple[float, float, int, int]:
    blockages = build(n)
    edges = sum(len(b.waiting) + len(b.targets) for b in blockages)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        find_culprits(blockages)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), len(blockages) + n, edges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=32_768)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for name, build in (("chain", chain), ("world_tie", world_tie), ("moe", moe)):
        median, best, nodes, edges = measure(build, args.ranks, args.repeat)
        culprits = find_culprits(build(args.ranks))
        print(f"{name:10s} ranks={args.ranks} nodes={nodes} edges={edges} "
              f"median={median * 1000:.1f} ms best={best * 1000:.1f} ms culprits={len(culprits)}")


if __name__ == "__main__":
    main()
