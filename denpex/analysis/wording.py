"""Small phrases shared by the comparison and the reports."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ranks_phrase"]


def ranks_phrase(ranks: Sequence[int], *, limit: int = 16) -> str:
    """``(2,)`` -> ``"rank 2"``; ``(0, 1, 3)`` -> ``"ranks 0, 1, 3"``; long lists are cut."""
    label = "rank" if len(ranks) == 1 else "ranks"
    shown = ", ".join(str(r) for r in ranks[:limit])
    more = f" and {len(ranks) - limit} more" if len(ranks) > limit else ""
    return f"{label} {shown}{more}"
