"""Which global ranks belong to each process group.

Sources, most trusted first: the job manifest; NCCL's ``pg_config`` (correct on NCCL, wrong on
Gloo, so summaries only carry it for NCCL dumps); the default group spans the world; otherwise the
ranks whose dumps mention the group (then a rank that left no dump cannot be counted in it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from denpex.analysis.rank_runs import RankRuns, expand_ranks
from denpex.analysis.summary import RankSummary
from denpex.evidence.manifest import JobManifest

__all__ = ["GroupMembership", "resolve_membership"]

_DEFAULT_PG_DESCS = frozenset({"default_pg"})


@dataclass(frozen=True, slots=True)
class GroupMembership:
    """Members of each group in group-rank order, and how each was learned."""

    members: dict[str, tuple[int, ...]] = field(default_factory=dict)
    descs: dict[str, str | None] = field(default_factory=dict)
    inferred: frozenset[str] = frozenset()
    conflicts: tuple[str, ...] = ()
    sets: dict[str, frozenset[int]] = field(default_factory=dict)

    def has_member(self, name: str, rank: int) -> bool:
        """Constant-time membership (a world group can hold 32,768 ranks)."""
        return rank in self.sets.get(name, ())


def resolve_membership(summaries: dict[int, RankSummary], manifest: JobManifest | None,
                       world_size: int) -> GroupMembership:
    """Group name -> member ranks, from the most trusted source available for each group."""
    configured: dict[str, RankRuns] = {}
    descs: dict[str, str | None] = {}
    conflicts: list[str] = []
    mentioned: dict[str, set[int]] = {}
    for rank, summary in sorted(summaries.items()):
        for name, group in summary.groups.items():
            if group.entry_count:
                mentioned.setdefault(name, set()).add(rank)
            descs.setdefault(name, group.desc)
            if group.config_ranks is None:
                continue
            seen = configured.setdefault(name, group.config_ranks)
            if seen != group.config_ranks:
                conflicts.append(
                    f"process group {name!r}: rank {rank}'s pg_config lists other members "
                    f"({_preview(group.config_ranks)}) than another rank's ({_preview(seen)})"
                )
    members = {name: expand_ranks(runs) for name, runs in configured.items()}
    inferred: set[str] = set()
    for name, ranks in mentioned.items():
        if name in members:
            continue
        if descs.get(name) in _DEFAULT_PG_DESCS:
            members[name] = tuple(range(world_size))
        else:
            members[name] = tuple(sorted(ranks))
            inferred.add(name)
    if manifest is not None:
        for name, spec in manifest.process_groups.items():
            members[name] = spec.ranks
            inferred.discard(name)
            if spec.desc is not None or name not in descs:
                descs[name] = spec.desc if spec.desc is not None else descs.get(name)
    return GroupMembership(members=members, descs=descs, inferred=frozenset(inferred),
                           conflicts=tuple(conflicts),
                           sets={name: frozenset(ranks) for name, ranks in members.items()})


def _preview(runs: RankRuns) -> str:
    ranks = expand_ranks(runs)
    return ", ".join(map(str, ranks[:8])) + (", ..." if len(ranks) > 8 else "")
