"""The Gloo hang scenarios: 4 ranks, their process groups, what each rank does, and the truth.

Process groups, by the names FR records in ``process_group[0]``::

    "0" default_pg [0, 1, 2, 3]   "1" tp [0, 1]   "2" tp [2, 3]   "3" dp [0, 2]   "4" dp [1, 3]

A step is: all_reduce in tp, all_reduce in dp, all_reduce in the world. The hang step differs
per scenario (see :data:`SCENARIOS`); :func:`expected_waits` plays it to say where each rank is
blocked. :mod:`testkit.generators.gloo_worker` runs one rank, :mod:`testkit.generators.gloo_scenarios`
launches and collects them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from denpex.analysis.models import CandidateKind, Verdict
from denpex.collector import DumpFormat

__all__ = [
    "WORLD_SIZE",
    "TP_GROUPS",
    "DP_GROUPS",
    "P2P_SRC",
    "P2P_DST",
    "DUMP_FORMATS",
    "Role",
    "ParentAction",
    "SignalKind",
    "Scenario",
    "SCENARIOS",
    "Wait",
    "host_name",
    "group_names",
    "expected_waits",
]

WORLD_SIZE = 4
TP_GROUPS = ((0, 1), (2, 3))
DP_GROUPS = ((0, 2), (1, 3))
P2P_SRC, P2P_DST = 1, 3
DUMP_FORMATS = (DumpFormat.PICKLE, DumpFormat.JSON)


class Role(StrEnum):
    """What one rank does in its scenario's hang step."""

    STEP = "step"
    """tp all_reduce, dp all_reduce, world all_reduce, as in every healthy step."""
    FINISH = "finish"
    """One more healthy step, then dump and exit: the healthy scenario."""
    WORLD = "world"
    """Only the world all_reduce, so that no rank waits on a dead peer in a 2-rank group."""
    IDLE = "idle"
    """Calls nothing: alive and answering dump requests, but withheld from every collective."""
    ALL_GATHER = "all_gather"
    """The step, with all_gather instead of the world all_reduce (same input tensor)."""
    SEND = "send"
    """``send`` to rank P2P_DST, which never posts the matching ``recv``."""


class ParentAction(StrEnum):
    """What the generator does to the target rank once every rank reached the hang step."""

    NONE = "none"
    SIGKILL = "sigkill"
    SIGSTOP = "sigstop"


class SignalKind(StrEnum):
    """How the first rank's dump request reaches the others."""

    FILE = "file"
    """A request file in a folder every rank shares."""
    STORE = "store"
    """A key in a TCPStore served by the launcher (as torchrun's agent serves one), for jobs
    without a shared folder; it outlives any rank."""


@dataclass(frozen=True)
class Scenario:
    """One hang (or none) and the triage answer it must get."""

    name: str
    description: str
    verdict: Verdict
    culprits: dict[int, CandidateKind] = field(default_factory=dict)
    roles: dict[int, Role] = field(default_factory=dict)
    default_role: Role = Role.STEP
    action: ParentAction = ParentAction.NONE
    target: int | None = None
    dump_signal: SignalKind = SignalKind.FILE

    def role(self, rank: int) -> Role:
        return self.roles.get(rank, self.default_role)

    @property
    def silent_ranks(self) -> frozenset[int]:
        """Ranks that cannot dump: killed or stopped by the generator."""
        if self.action is ParentAction.NONE or self.target is None:
            return frozenset()
        return frozenset({self.target})


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy", "no hang: every rank finishes its steps and dumps at the end",
             Verdict.NO_HANG, default_role=Role.FINISH),
    Scenario("withheld_one", "rank 2 is alive but never calls its tp all_reduce; rank 3 waits in "
             "tp '2', rank 0 in dp '3' for rank 2, rank 1 in dp '4' for rank 3",
             Verdict.LOCALIZED, {2: CandidateKind.NOT_ENTERED}, {2: Role.IDLE}),
    Scenario("withheld_two", "ranks 1 and 2 are alive but call nothing; rank 0 waits in tp '1', "
             "rank 3 in tp '2'; the dump request travels through the generator's TCPStore",
             Verdict.LOCALIZED,
             {1: CandidateKind.NOT_ENTERED, 2: CandidateKind.NOT_ENTERED},
             {1: Role.IDLE, 2: Role.IDLE}, dump_signal=SignalKind.STORE),
    Scenario("mismatch", "rank 3 calls all_gather where ranks 0-2 call all_reduce, at the same "
             "world collective_seq_id; every rank hangs", Verdict.LOCALIZED,
             {3: CandidateKind.MISMATCH}, {3: Role.ALL_GATHER}),
    Scenario("sigkill", "rank 1 idles and is SIGKILLed while ranks 0, 2 and 3 wait for it in the "
             "world all_reduce", Verdict.INCOMPLETE, {1: CandidateKind.STOPPED_REPORTING},
             {1: Role.IDLE}, Role.WORLD, ParentAction.SIGKILL, 1),
    Scenario("sigstop", "rank 2 idles and is SIGSTOPped while ranks 0, 1 and 3 wait for it in "
             "the world all_reduce", Verdict.INCOMPLETE, {2: CandidateKind.STOPPED_REPORTING},
             {2: Role.IDLE}, Role.WORLD, ParentAction.SIGSTOP, 2),
    Scenario("p2p_hang", f"rank {P2P_SRC} blocks in send to rank {P2P_DST}, which never receives; "
             f"Gloo does not record p2p, so rank {P2P_SRC} looks as if it never entered tp '1'",
             Verdict.LOCALIZED, {P2P_SRC: CandidateKind.NOT_ENTERED}, {P2P_SRC: Role.SEND}),
)}


def host_name(rank: int) -> str:
    """The fake host of ``rank`` in every manifest: one rank per node."""
    return f"gpu-node-{rank + 1:03d}"


def group_names() -> dict[tuple[int, ...], str]:
    """FR's name for each group: the world is "0", then new_group() calls count up in order."""
    ordered = [tuple(range(WORLD_SIZE)), *TP_GROUPS, *DP_GROUPS]
    return {ranks: str(i) for i, ranks in enumerate(ordered)}


@dataclass(frozen=True)
class Wait:
    """Where a rank is blocked when its scenario's dumps are triggered (before any timeout)."""

    process_group: str
    collective_seq_id: int
    op: str


def expected_waits(scenario: Scenario, steps: int) -> dict[int, Wait]:
    """Play the hang step's calls and return each rank left blocked in a collective.

    A group's op completes once every member's next call is that op; different ops at the same
    point never complete. A rank blocked in ``send`` is left out: Gloo does not record p2p in FR.
    Sequence ids: ``steps`` healthy steps, then the world barrier, then the hang step.

    >>> expected_waits(SCENARIOS["withheld_two"], steps=2)[0]
    Wait(process_group='1', collective_seq_id=3, op='gloo:all_reduce')
    """
    names = group_names()
    world = names[tuple(range(WORLD_SIZE))]
    members = {name: ranks for ranks, name in names.items()}

    def calls(rank: int) -> list[tuple[str, str]]:
        role = Role.IDLE if rank in scenario.silent_ranks else scenario.role(rank)
        tp = next(names[g] for g in TP_GROUPS if rank in g)
        dp = next(names[g] for g in DP_GROUPS if rank in g)
        last = "gloo:all_gather" if role is Role.ALL_GATHER else "gloo:all_reduce"
        return {Role.IDLE: [], Role.SEND: [("p2p", "send")], Role.WORLD: [(world, "gloo:all_reduce")]
                }.get(role, [(tp, "gloo:all_reduce"), (dp, "gloo:all_reduce"), (world, last)])

    pending = {r: calls(r) for r in range(WORLD_SIZE)}
    progressed = True
    while progressed:
        progressed = False
        for group, ranks in members.items():
            heads = {pending[r][0] if pending[r] else None for r in ranks}
            if len(heads) == 1 and (head := heads.pop()) is not None and head[0] == group:
                for r in ranks:
                    pending[r].pop(0)
                progressed = True
    waits = {}
    for rank, left in pending.items():
        if left and left[0][0] != "p2p":
            group, op = left[0]
            waits[rank] = Wait(group, steps + (2 if group == world else 1), op)
    return waits
