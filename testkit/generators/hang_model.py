"""A 3D-parallel training job, its last step, and how one faulty rank makes it hang.

The expansion (``testkit.generators.expansion``) writes dumps from what this module decides: which
op each rank runs, in which group, and where each rank is when the dumps are taken.

- Layout: ``tp`` x ``dp`` x ``pp`` ranks, DeviceMesh order
  ``rank = stage * (dp * tp) + dp_index * tp + tp_index``.
- One step of pipeline ``stage``: per microbatch a forward (``recv`` from the previous stage, two
  tensor-parallel ``all_reduce``, ``send`` to the next stage) and a backward (the mirror image),
  then ``_reduce_scatter_base`` on the data-parallel group, an ``all_reduce`` on the world and
  ``_all_gather_base`` on the data-parallel group.
- The hang is simulated, not drawn by hand: each rank blocks in its current op (a rank blocked in a
  ``send`` cannot enqueue its next collective), an op completes once every member of its group (or
  both p2p peers) has reached it, and the faulty rank misbehaves as its scenario says. The cascade
  of victims across groups follows from that.

Example: with ``Scenario.WITHHELD`` the culprit (stage 1) never enqueues its forward
``all_reduce``; its tensor-parallel peers wait in it, its pipeline neighbours block in ``send`` /
``recv`` to it, and every other rank ends up waiting in a data-parallel or world collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum

from denpex.analysis.models import CandidateKind, Verdict

__all__ = [
    "ExpansionError",
    "Scenario",
    "GroupKind",
    "FaultMode",
    "RankState",
    "ScenarioSpec",
    "SCENARIOS",
    "ParallelLayout",
    "PlannedOp",
    "Fault",
    "MICROBATCHES",
    "SHARD_ELEMENTS",
    "stage_program",
    "culprit_rank",
    "fault_for",
    "simulate_last_step",
]

MICROBATCHES = 4
SHARD_ELEMENTS = 1 << 20
_ACTIVATION = (4096, 8192)


class ExpansionError(ValueError):
    """The expansion was asked for something it cannot build (bad layout, unusable template)."""


class Scenario(StrEnum):
    """The fault injected into the synthetic job."""

    HEALTHY = "healthy"
    """No fault: every rank finished its last step; the dumps show no hang."""
    WITHHELD = "withheld"
    """A live rank stops before a tensor-parallel all_reduce in the forward pass and still dumps."""
    MISMATCH = "mismatch"
    """A rank calls the data-parallel reduce-scatter with a different size; the group hangs."""
    MISSING = "missing"
    """A rank stops mid-backward and leaves no dump at all (dead host)."""
    STALLED = "stalled"
    """A rank is stuck in a tensor-parallel all_reduce that all its peers entered and finished."""
    P2P = "p2p"
    """A middle pipeline stage never posts its backward ``recv``; its neighbours block in p2p."""


class GroupKind(StrEnum):
    """Which process group an op runs in; the value is the group's desc."""

    WORLD = "default_pg"
    TP = "mesh_tp"
    DP = "mesh_dp"
    PP = "mesh_pp"


class FaultMode(IntEnum):
    """How the faulty rank misbehaves at its op."""

    FREEZE = 0
    """Stops before enqueuing the op (the op is not in its ring)."""
    STALL = 1
    """Enqueues the op; it completes for every peer but never for this rank."""
    MISMATCH = 2
    """Enqueues the op with a different size; it completes for no one."""


class RankState(IntEnum):
    """Where a rank is when the dumps are taken."""

    DONE = 0
    """Finished the step; nothing in flight."""
    WAITING = 1
    """Enqueued its current op and waits in it."""
    STALLED = 2
    """Enqueued its current op, which finished for its peers but not for it."""
    FROZEN = 3
    """Stopped before enqueuing its current op."""


@dataclass(frozen=True)
class ScenarioSpec:
    """Where the fault sits and what a correct triage says about it."""

    stage: int
    label: str
    mode: FaultMode
    verdict: Verdict
    kind: CandidateKind
    dumps: bool = True
    """False: the culprit leaves no dump file."""


_LAST_MB = MICROBATCHES - 1
SCENARIOS: dict[Scenario, ScenarioSpec | None] = {
    Scenario.HEALTHY: None,
    Scenario.WITHHELD: ScenarioSpec(
        1, "fwd[1].all_reduce[0]", FaultMode.FREEZE, Verdict.LOCALIZED, CandidateKind.NOT_ENTERED
    ),
    Scenario.MISMATCH: ScenarioSpec(
        3, "dp.reduce_scatter", FaultMode.MISMATCH, Verdict.LOCALIZED, CandidateKind.MISMATCH
    ),
    Scenario.MISSING: ScenarioSpec(
        0, "bwd[2].all_reduce[0]", FaultMode.FREEZE, Verdict.INCOMPLETE,
        CandidateKind.STOPPED_REPORTING, dumps=False,
    ),
    Scenario.STALLED: ScenarioSpec(
        2, f"bwd[{_LAST_MB}].all_reduce[1]", FaultMode.STALL, Verdict.LOCALIZED,
        CandidateKind.STALLED,
    ),
    Scenario.P2P: ScenarioSpec(
        2, f"bwd[{_LAST_MB}].recv", FaultMode.FREEZE, Verdict.LOCALIZED, CandidateKind.NOT_ENTERED
    ),
}


@dataclass(frozen=True)
class ParallelLayout:
    """``world_size`` ranks as tp x dp x pp; ``rank = stage*(dp*tp) + dp_index*tp + tp_index``."""

    world_size: int
    tp: int = 8
    pp: int = 4

    def __post_init__(self) -> None:
        block = self.tp * self.pp
        if self.tp < 2 or self.pp < 2 or self.world_size % block or self.world_size < 2 * block:
            raise ExpansionError(
                f"world_size {self.world_size} does not split as tp={self.tp} x pp={self.pp} x "
                f"dp>=2; use a multiple of {block} that is at least {2 * block}"
            )

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``rank -> (stage, dp_index, tp_index)``."""
        stage, rest = divmod(rank, self.dp * self.tp)
        d, t = divmod(rest, self.tp)
        return stage, d, t

    def rank_of(self, stage: int, d: int, t: int) -> int:
        return stage * self.dp * self.tp + d * self.tp + t

    def group_index(self, kind: GroupKind, rank: int) -> int:
        """A dense index of ``rank``'s group among the groups of ``kind``."""
        s, d, t = self.coords(rank)
        if kind is GroupKind.WORLD:
            return 0
        if kind is GroupKind.TP:
            return s * self.dp + d
        if kind is GroupKind.DP:
            return s * self.tp + t
        return d * self.tp + t

    def group_count(self, kind: GroupKind) -> int:
        return {
            GroupKind.WORLD: 1,
            GroupKind.TP: self.pp * self.dp,
            GroupKind.DP: self.pp * self.tp,
            GroupKind.PP: self.dp * self.tp,
        }[kind]

    def groups(self, kind: GroupKind) -> list[list[int]]:
        """Every group of ``kind`` as ascending global ranks, indexed by ``group_index``."""
        members: list[list[int]] = [[] for _ in range(self.group_count(kind))]
        for rank in range(self.world_size):
            members[self.group_index(kind, rank)].append(rank)
        return members


@dataclass(frozen=True)
class PlannedOp:
    """One op of a stage's step."""

    label: str
    """Stable name used to place faults, e.g. ``bwd[3].recv``."""
    kind: GroupKind
    name: str
    """``all_reduce``, ``send``, ``recv``, ``_reduce_scatter_base``, ``_all_gather_base``."""
    peer: int | None
    """Pipeline stage of the p2p peer; None for collectives."""
    sizes_in: list[list[int]]
    sizes_out: list[list[int]]
    stack: str
    """Which template stack the entry carries."""
    ordinal: int
    """Index among the step's ops that rendezvous the same way (per group, or per p2p pair)."""


def stage_program(stage: int, pp: int, dp: int) -> list[PlannedOp]:
    """One training step of pipeline ``stage``, in the order its ops are enqueued."""
    act = [list(_ACTIVATION)]
    raw: list[tuple[str, GroupKind, str, int | None, list[list[int]], list[list[int]], str]] = []

    def p2p(label: str, op: str, peer: int) -> None:
        raw.append((label, GroupKind.PP, op, peer, act, act, op))

    def tp_all_reduce(label: str) -> None:
        raw.append((label, GroupKind.TP, "all_reduce", None, act, act, "all_reduce"))

    for mb in range(MICROBATCHES):
        if stage > 0:
            p2p(f"fwd[{mb}].recv", "recv", stage - 1)
        tp_all_reduce(f"fwd[{mb}].all_reduce[0]")
        tp_all_reduce(f"fwd[{mb}].all_reduce[1]")
        if stage < pp - 1:
            p2p(f"fwd[{mb}].send", "send", stage + 1)
    for mb in range(MICROBATCHES):
        if stage < pp - 1:
            p2p(f"bwd[{mb}].recv", "recv", stage + 1)
        tp_all_reduce(f"bwd[{mb}].all_reduce[0]")
        tp_all_reduce(f"bwd[{mb}].all_reduce[1]")
        if stage > 0:
            p2p(f"bwd[{mb}].send", "send", stage - 1)
    raw.append(("dp.reduce_scatter", GroupKind.DP, "_reduce_scatter_base", None,
                [[dp * SHARD_ELEMENTS]], [[SHARD_ELEMENTS]], "reduce_scatter"))
    raw.append(("world.all_reduce", GroupKind.WORLD, "all_reduce", None, [[1]], [[1]],
                "world_all_reduce"))
    raw.append(("dp.all_gather", GroupKind.DP, "_all_gather_base", None,
                [[SHARD_ELEMENTS]], [[dp * SHARD_ELEMENTS]], "all_gather"))
    counters: dict[tuple[object, ...], int] = {}
    program = []
    for label, kind, name, peer, s_in, s_out, stack in raw:
        key: tuple[object, ...] = (kind, name, peer) if kind is GroupKind.PP else (kind,)
        ordinal = counters.get(key, 0)
        counters[key] = ordinal + 1
        program.append(PlannedOp(label, kind, name, peer, s_in, s_out, stack, ordinal))
    return program


@dataclass(frozen=True)
class Fault:
    """The faulty rank, the index of its op in the step, and how it misbehaves there."""

    rank: int
    op_index: int
    mode: FaultMode


def culprit_rank(layout: ParallelLayout, scenario: Scenario) -> int | None:
    """The faulty rank: a fixed, unremarkable rank in the middle of the job (never rank 0)."""
    spec = SCENARIOS[scenario]
    if spec is None:
        return None
    return layout.rank_of(spec.stage, (layout.dp // 2 + 1) % layout.dp, 5 % layout.tp)


def fault_for(
    layout: ParallelLayout, scenario: Scenario, programs: Sequence[list[PlannedOp]]
) -> Fault | None:
    spec = SCENARIOS[scenario]
    rank = culprit_rank(layout, scenario)
    if spec is None or rank is None:
        return None
    labels = [op.label for op in programs[spec.stage]]
    return Fault(rank, labels.index(spec.label), spec.mode)


def _rendezvous(layout: ParallelLayout, rank: int, op: PlannedOp) -> tuple[tuple[object, ...], int]:
    """The rendezvous an op joins, and how many ranks complete it."""
    s, d, t = layout.coords(rank)
    if op.kind is GroupKind.PP:
        src, dst = (s, op.peer) if op.name == "send" else (op.peer, s)
        return ("pp", d, t, src, dst, op.ordinal), 2
    if op.kind is GroupKind.WORLD:
        return ("world", op.ordinal), layout.world_size
    if op.kind is GroupKind.TP:
        return ("tp", s, d, op.ordinal), layout.tp
    return ("dp", s, t, op.ordinal), layout.dp


def simulate_last_step(
    layout: ParallelLayout, programs: Sequence[list[PlannedOp]], fault: Fault | None
) -> tuple[list[int], list[RankState]]:
    """Run the last step on every rank; return each rank's op index and state at dump time.

    Event-driven: each rank arrives at each op once, so the cost is linear in ranks x ops.
    """
    n = layout.world_size
    pos = [0] * n
    state = [RankState.DONE] * n
    waiting: dict[tuple[object, ...], list[int]] = {}
    fault_key = None
    if fault is not None:
        stage = layout.coords(fault.rank)[0]
        fault_key = _rendezvous(layout, fault.rank, programs[stage][fault.op_index])[0]
    stack = list(range(n - 1, -1, -1))
    while stack:
        r = stack.pop()
        program = programs[layout.coords(r)[0]]
        while True:
            i = pos[r]
            if i == len(program):
                state[r] = RankState.DONE
                break
            if (fault is not None and r == fault.rank and i == fault.op_index
                    and fault.mode is FaultMode.FREEZE):
                state[r] = RankState.FROZEN
                break
            key, size = _rendezvous(layout, r, program[i])
            members = waiting.setdefault(key, [])
            members.append(r)
            state[r] = RankState.WAITING
            if len(members) < size:
                break
            if fault is not None and key == fault_key and fault.mode is FaultMode.MISMATCH:
                break  # everyone arrived; the mismatched op completes for no one
            del waiting[key]
            moved_on = False
            for m in members:
                if fault is not None and m == fault.rank and key == fault_key:
                    state[m] = RankState.STALLED
                    continue
                pos[m] += 1
                if m == r:
                    moved_on = True
                else:
                    stack.append(m)
            if not moved_on:
                break
    return pos, state
