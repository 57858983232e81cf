"""What the rules read and write for one process group, and the two shapes a rule takes.

Every rule in :data:`denpex.analysis.compare.RULES` is a :data:`Step`: it reads the group's
facts (:class:`GroupFacts`) and records what it found in the group's :class:`Findings`. The rules
that judge the group's stuck collective are written as :data:`StuckRule` (the op in, a blockage
or None out) and adapted with :func:`decide`: the first of them that finds a blockage decides
the op, and the rest are skipped, so their order in ``RULES`` is their priority.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from denpex.analysis.blockage import Blockage
from denpex.analysis.compare.age import Clock
from denpex.analysis.compare.found import Found
from denpex.analysis.compare.heads import Head
from denpex.analysis.membership import GroupMembership
from denpex.analysis.summary import GroupProgress, PendingOp, RankSummary

__all__ = ["Findings", "GroupFacts", "Step", "StuckOp", "StuckRule", "decide"]


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """Everything the rules may read about one process group; nothing here changes per rule."""

    name: str
    members: tuple[int, ...]
    # Members whose progress in the group is known (``progress.known_progress``).
    progress: dict[int, GroupProgress]
    # Members whose wrapped rings hide the group and whose pg_status cannot bound them.
    unknown: tuple[int, ...]
    missing: set[int]
    summaries: dict[int, RankSummary]
    membership: GroupMembership
    heads: dict[int, Head]
    clock: Clock
    # Gloo's pg_config is read against the world's size (summary.RankSummary.built_subgroup).
    world_size: int
    # Shared across groups: each group's sorted enqueue levels, built once (tie_breaks.lagging_at).
    lag_cache: dict[str, list[int]]


@dataclass(frozen=True, slots=True)
class StuckOp:
    """The group's stuck collective ``#seq`` and where each member stands in it."""

    seq: int
    # A peer shows it finished though not every member enqueued it: it failed (Gloo retires those).
    failed: bool
    # Members that enqueued it and did not finish it, with their op there.
    waiting_ops: dict[int, PendingOp]
    # The holders for which it is the oldest op in flight: only they wait in it now.
    ready: dict[int, PendingOp]
    behind: tuple[int, ...]
    absent: tuple[int, ...]
    # How the op reads in a blockage (the first holder's call).
    op_text: str
    # The op past its timeout, read once here because two rules weigh it (started, tie).
    overdue: Blockage | None

    @property
    def ready_ops(self) -> list[tuple[int, PendingOp]]:
        """The ready holders' ops: those whose age decides whether the blockage is progress."""
        return list(self.ready.items())


@dataclass(slots=True)
class Findings:
    """What the rules found in one group, in the order the comparison reports them."""

    stuck_op: StuckOp | None = None
    # True once a StuckRule decided the stuck op (even when it decided it is progress).
    decided: bool = False
    stuck: Found | None = None
    # Which member of an all-in tie the others wait on (``tie_breaks``), when one is singled out.
    direction: Found | None = None
    p2p: list[Found] = field(default_factory=list)
    # Stuck ops every holder enqueued behind its own unfinished op: reported only when nothing
    # else in the whole job is (``compare_groups``).
    deferred: list[Found] = field(default_factory=list)
    # Waits on members that never reached a collective their peers hold (``denpex.analysis.unreached``).
    waits: list[Found] = field(default_factory=list)
    directions: list[Found] = field(default_factory=list)

    def found(self) -> list[Found]:
        """The group's blockages in report order: the stuck op, its tie's direction, p2p ones."""
        return [f for f in (self.stuck, self.direction, *self.p2p) if f is not None]


Step = Callable[[GroupFacts, Findings], None]
StuckRule = Callable[[GroupFacts, StuckOp], Found | None]


def decide(rule: StuckRule) -> Step:
    """``rule`` as a step that judges the stuck op unless an earlier rule already did.

    The last StuckRule may find the op to be progress (None): nothing after it judges the op, so
    None from it and None from every rule read the same.
    """
    def step(group: GroupFacts, findings: Findings) -> None:
        if findings.stuck_op is None or findings.decided:
            return
        found = rule(group, findings.stuck_op)
        if found is not None:
            findings.stuck, findings.decided = found, True

    step.__name__ = step.__qualname__ = rule.__name__
    step.__doc__ = rule.__doc__
    return step
