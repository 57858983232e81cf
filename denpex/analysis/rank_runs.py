"""Rank lists as arithmetic runs, so that a 32,768-rank group costs a few ints, not 32,768.

Every NCCL dump repeats each of its groups' global rank lists in ``pg_config``; the world group's
list alone is ~190 KB of text at 32k ranks. Summaries keep runs instead::

    >>> compress_ranks([0, 1, 2, 3, 8, 16, 24])
    ((0, 4, 1), (8, 3, 8))
    >>> expand_ranks(((0, 4, 1), (8, 3, 8)))
    (0, 1, 2, 3, 8, 16, 24)
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RankRuns", "compress_ranks", "expand_ranks", "parse_rank_list"]

# (first rank, how many, step)
RankRuns = tuple[tuple[int, int, int], ...]


def compress_ranks(ranks: Sequence[int]) -> RankRuns:
    """Greedy runs of equal steps, in the given order (group-rank order matters for p2p)."""
    runs: list[tuple[int, int, int]] = []
    i, n = 0, len(ranks)
    while i < n:
        if i + 1 == n:
            runs.append((ranks[i], 1, 1))
            break
        step = ranks[i + 1] - ranks[i]
        j = i + 1
        while j + 1 < n and ranks[j + 1] - ranks[j] == step:
            j += 1
        runs.append((ranks[i], j - i + 1, step if step else 1))
        i = j + 1
    return tuple(runs)


def expand_ranks(runs: RankRuns) -> tuple[int, ...]:
    return tuple(start + k * step for start, count, step in runs for k in range(count))


def parse_rank_list(value: object) -> RankRuns | None:
    """``"[0, 1, 2]"`` (NCCL's string form) or a list of ints -> runs; anything else -> None.

    Parsed by hand, never with ``eval``; an empty list says nothing and gives None.
    """
    if isinstance(value, str):
        body = value.strip()
        if len(body) < 2 or body[0] != "[" or body[-1] != "]":
            return None
        parts = body[1:-1].split(",")
        try:
            ranks = [int(p) for p in parts if p.strip()]
        except ValueError:
            return None
    elif isinstance(value, (list, tuple)) and all(type(r) is int for r in value):
        ranks = list(value)
    else:
        return None
    if not ranks or min(ranks) < 0 or len(set(ranks)) != len(ranks):
        return None
    return compress_ranks(ranks)
