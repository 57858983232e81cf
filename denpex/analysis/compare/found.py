"""What every rule returns: a blockage, and the ops whose age decides whether it is a hang.

The ops are the waiting ranks' own, so that a blockage whose every waiting op is provably young
is reported as progress (:func:`denpex.analysis.compare.age.young`), not as a hang.
"""

from __future__ import annotations

from denpex.analysis.blockage import Blockage
from denpex.analysis.summary import PendingOp

__all__ = ["Found", "RankOp"]

# One waiting rank and its op in the stuck collective or transfer.
RankOp = tuple[int, PendingOp]
# A blockage and the waiting ops that date it (empty when its age must not excuse it).
Found = tuple[Blockage, list[RankOp]]
