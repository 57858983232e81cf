"""A small discrete-event model of ProcessGroupNCCL: enqueue on the CPU, run on one GPU stream.

The model, and why it is close enough for hang triage:

- **CPU**: each rank walks its program. A comm call is *enqueued* (a ``WorkNCCL`` is created and
  recorded in the Flight Recorder) and the CPU moves on at once: NCCL is asynchronous. Only a
  ``CpuSync`` (``torch.cuda.synchronize()``, ``.item()``) blocks until every enqueued op is done.
  A ``Hang`` stops the CPU for good.
- **GPU**: a rank's ops run one after the other (collectives run on the current stream, and p2p
  streams wait for it and are waited on), so an op *starts* (its start event fires) when it
  reaches the head of the stream. A collective completes when every member has it started and
  all members agree on the op, sizes and dtypes; otherwise it never completes. A send completes
  with its matching recv: the k-th send from ``a`` to ``b`` in a group pairs with ``b``'s k-th
  recv from ``a`` (NCCL matches in order per peer and direction). A batch completes when all its
  pairs have both sides started.
- **Counters** follow ProcessGroupNCCL.cpp (torch 2.13): ``collective()`` bumps
  ``seqCollective_`` and ``op_id_``; ``pointToPoint()`` bumps ``seqP2P_`` per op, or once per
  batch; every op bumps ``op_id_``; coalesced members are recorded without events and the
  closing entry carries the group's state; ``record_id`` is one counter per process.

Times are nanoseconds from the start of the simulated window; ``nccl_dump`` adds the epoch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from enum import StrEnum

from testkit.generators.nccl_program import (
    CollectiveCall,
    Compute,
    CpuSync,
    Hang,
    P2PCall,
    P2PMode,
    Phase,
    ProgramItem,
)
from testkit.generators.nccl_topology import Topology

__all__ = [
    "WorkKind",
    "Work",
    "Record",
    "GroupCounters",
    "RankCounters",
    "Simulation",
    "count_step",
]

_US = 1_000
_COLLECTIVE_ENQUEUE_NS = 35 * _US
_P2P_ENQUEUE_NS = 45 * _US
_MEMBER_ENQUEUE_NS = 12 * _US
_SYNC_NS = 30 * _US


class WorkKind(StrEnum):
    """What occupies the rank's stream."""

    COMPUTE = "compute"
    """A local kernel; never recorded by FR."""
    COLLECTIVE = "collective"
    """A collective WorkNCCL (including a coalesced group's closing work)."""
    P2P = "p2p"
    """A send, a recv, or a batch's ``nccl:coalesced`` work."""


# (group, src, dst, k): the k-th op from src to dst in group, as seen by either side.
PairKey = tuple[str, int, int, int]


@dataclass(slots=True, eq=False)
class Work:
    """One item on a rank's stream, with the times the model assigns to it."""

    rank: int
    kind: WorkKind
    created_ns: int
    duration_ns: int
    group: str | None = None
    seq: int = -1  # WorkNCCL::seq_: seqCollective_ or seqP2P_
    signature: tuple[object, ...] = ()
    pairs: tuple[PairKey, ...] = ()
    ready_ns: int | None = None  # reached the head of the stream: the start event fired
    complete_ns: int | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """One Flight Recorder entry, before the dump turns it into a dict."""

    record_id: int
    rank: int
    group: str
    pg_id: int
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    profiling_name: str
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    is_p2p: bool
    created_ns: int
    thread: Phase
    site: str
    step: int
    # The work whose start/end events this entry borrowed; None for coalesced members, which
    # FlightRecorder::record() gets with null events and never retires.
    work: Work | None = field(compare=False)


@dataclass(slots=True)
class GroupCounters:
    """ProcessGroupNCCL's per-group counters, plus the pg_status left by earlier steps."""

    coll: int = 0
    p2p: int = 0
    op: int = 0
    # WorkNCCL::seq_ of the last work before the simulated window; it completed, so pg_status
    # reported it as enqueued, started (with timing) and completed.
    last_work_seq: int = -1


@dataclass(slots=True)
class RankCounters:
    """One process's counters: the FR ``record_id`` and each of its groups' counters."""

    record_id: int = 0
    groups: dict[str, GroupCounters] = field(default_factory=dict)

    def group(self, name: str) -> GroupCounters:
        counters = self.groups.get(name)
        if counters is None:
            counters = self.groups[name] = GroupCounters()
        return counters

    def copy(self) -> "RankCounters":
        return RankCounters(
            self.record_id,
            {name: GroupCounters(c.coll, c.p2p, c.op, c.last_work_seq) for name, c in self.groups.items()},
        )


class Simulation:
    """Run every rank's program until no CPU and no stream can make progress."""

    def __init__(self, topology: Topology, programs: dict[int, list[ProgramItem]],
                 counters: dict[int, RankCounters], cpu_start_ns: dict[int, int]) -> None:
        self.topology = topology
        self.programs = programs
        self.counters = {rank: c.copy() for rank, c in counters.items()}
        self.start_counters = {rank: c.copy() for rank, c in counters.items()}
        self.cpu_ns = dict(cpu_start_ns)
        self.pc = {rank: 0 for rank in programs}
        self.streams: dict[int, list[Work]] = {rank: [] for rank in programs}
        self.head = {rank: 0 for rank in programs}
        self.records: dict[int, list[Record]] = {rank: [] for rank in programs}
        self.hung: dict[int, str] = {}
        self._collectives: dict[tuple[str, int], dict[int, Work]] = defaultdict(dict)
        self._pair_sides: dict[PairKey, dict[bool, Work]] = defaultdict(dict)
        self._pair_count: dict[tuple[str, int, int, bool], int] = defaultdict(int)

    # -- running -------------------------------------------------------------------------

    def run(self) -> None:
        progress = True
        while progress:
            progress = False
            for rank in self.programs:
                progress |= self._advance_cpu(rank)
            progress |= self._advance_gpus()

    def blocked_at(self, rank: int) -> ProgramItem | None:
        """The program item the rank's CPU is stuck at, or None if it finished its program."""
        pc = self.pc[rank]
        program = self.programs[rank]
        return program[pc] if pc < len(program) else None

    def incomplete(self, rank: int) -> list[Work]:
        """NCCL works enqueued by ``rank`` that never completed, oldest first."""
        return [w for w in self.streams[rank] if w.kind is not WorkKind.COMPUTE and w.complete_ns is None]

    def end_ns(self) -> int:
        """When the last thing that happened, happened: the last completion or enqueue."""
        times = [self.cpu_ns[r] for r in self.programs]
        times += [w.complete_ns for s in self.streams.values() for w in s if w.complete_ns is not None]
        return max(times)

    def collective_works(self, group: str, seq: int) -> dict[int, Work]:
        return dict(self._collectives.get((group, seq), {}))

    def pair_side(self, key: PairKey, is_send: bool) -> Work | None:
        return self._pair_sides.get(key, {}).get(is_send)

    # -- CPU -------------------------------------------------------------------------------

    def _advance_cpu(self, rank: int) -> bool:
        program = self.programs[rank]
        moved = False
        while self.pc[rank] < len(program):
            item = program[self.pc[rank]]
            if isinstance(item, Hang):
                self.hung[rank] = item.reason
                return moved
            if isinstance(item, CpuSync):
                stream = self.streams[rank]
                if any(w.complete_ns is None for w in stream):
                    return moved
                done = max((w.complete_ns for w in stream if w.complete_ns is not None), default=0)
                self.cpu_ns[rank] = max(self.cpu_ns[rank], done) + _SYNC_NS
            elif isinstance(item, Compute):
                self._push(Work(rank, WorkKind.COMPUTE, self.cpu_ns[rank], item.duration_us * _US))
                self.cpu_ns[rank] += item.launch_us * _US
            elif isinstance(item, CollectiveCall):
                self._enqueue_collective(rank, item)
            else:
                self._enqueue_p2p(rank, item)
            self.pc[rank] += 1
            moved = True
        return moved

    def _push(self, work: Work) -> None:
        self.streams[work.rank].append(work)

    def _record(self, rank: int, work: Work | None, group: str, counters: GroupCounters,
                name: str, sizes: tuple[tuple[tuple[int, ...], ...], tuple[str, ...],
                                        tuple[tuple[int, ...], ...], tuple[str, ...]],
                is_p2p: bool, thread: Phase, site: str, step: int) -> None:
        rank_counters = self.counters[rank]
        self.records[rank].append(Record(
            record_id=rank_counters.record_id, rank=rank, group=group,
            pg_id=self.topology.pg_id(rank, group), collective_seq_id=counters.coll,
            p2p_seq_id=counters.p2p, op_id=counters.op, profiling_name=name,
            input_sizes=sizes[0], input_dtypes=sizes[1], output_sizes=sizes[2],
            output_dtypes=sizes[3], is_p2p=is_p2p, created_ns=self.cpu_ns[rank], thread=thread,
            site=site, step=step, work=work,
        ))
        rank_counters.record_id += 1

    def _enqueue_collective(self, rank: int, call: CollectiveCall) -> None:
        counters = self.counters[rank].group(call.group)
        counters.coll += 1
        for member in call.members:
            counters.op += 1
            self._record(rank, None, call.group, counters, member.op, _sizes(member), False,
                         call.phase, member.site, call.step)
            self.cpu_ns[rank] += _MEMBER_ENQUEUE_NS
        if not call.members:
            counters.op += 1
        work = Work(rank, WorkKind.COLLECTIVE, self.cpu_ns[rank], call.duration_us * _US,
                    call.group, counters.coll, call.signature())
        self._record(rank, work, call.group, counters, call.op, _sizes(call), False, call.phase,
                     call.site, call.step)
        self._push(work)
        self._collectives[(call.group, counters.coll)][rank] = work
        self.cpu_ns[rank] += _COLLECTIVE_ENQUEUE_NS

    def _enqueue_p2p(self, rank: int, call: P2PCall) -> None:
        counters = self.counters[rank].group(call.group)
        info = self.topology.groups[call.group]
        me = info.group_rank(rank)
        if call.mode is P2PMode.BATCHED:
            counters.p2p += 1  # once per batch (pointToPoint, first op under CoalActive)
            keys = []
            for op in call.ops:
                counters.op += 1
                keys.append(self._pair_key(call.group, op.src, op.dst, op.is_send))
                self._record(rank, None, call.group, counters, _p2p_name(op.is_send, me, info.group_rank(
                    op.dst if op.is_send else op.src)), _p2p_sizes(op.size, op.dtype), True,
                    call.phase, call.site, call.step)
                self.cpu_ns[rank] += _MEMBER_ENQUEUE_NS
            work = Work(rank, WorkKind.P2P, self.cpu_ns[rank], call.duration_us * _US, call.group,
                        counters.p2p, pairs=tuple(keys))
            # endCoalescing -> initWork(COALESCED): empty sizes, isP2POp(COALESCED) is false.
            self._record(rank, work, call.group, counters, "nccl:coalesced", ((), (), (), ()),
                         False, call.phase, call.site, call.step)
            self._register_pairs(work, call)
            self._push(work)
            self.cpu_ns[rank] += _P2P_ENQUEUE_NS
            return
        for op in call.ops:
            counters.p2p += 1
            counters.op += 1
            key = self._pair_key(call.group, op.src, op.dst, op.is_send)
            work = Work(rank, WorkKind.P2P, self.cpu_ns[rank], call.duration_us * _US, call.group,
                        counters.p2p, pairs=(key,))
            peer = info.group_rank(op.dst if op.is_send else op.src)
            self._record(rank, work, call.group, counters, _p2p_name(op.is_send, me, peer),
                         _p2p_sizes(op.size, op.dtype), True, call.phase, call.site, call.step)
            self._pair_sides[key][op.is_send] = work
            self._push(work)
            self.cpu_ns[rank] += _P2P_ENQUEUE_NS

    def _pair_key(self, group: str, src: int, dst: int, is_send: bool) -> PairKey:
        slot = (group, src, dst, is_send)
        k = self._pair_count[slot]
        self._pair_count[slot] = k + 1
        return (group, src, dst, k)

    def _register_pairs(self, work: Work, call: P2PCall) -> None:
        for key, op in zip(work.pairs, call.ops, strict=True):
            self._pair_sides[key][op.is_send] = work

    # -- GPU -------------------------------------------------------------------------------

    def _advance_gpus(self) -> bool:
        progress = False
        changed = True
        while changed:
            changed = False
            for rank, stream in self.streams.items():
                while self.head[rank] < len(stream):
                    work = stream[self.head[rank]]
                    if work.ready_ns is None:
                        before = stream[self.head[rank] - 1].complete_ns if self.head[rank] else 0
                        work.ready_ns = max(work.created_ns, before or 0)
                    if work.complete_ns is None and not self._try_complete(work):
                        break
                    self.head[rank] += 1
                    changed = progress = True
        return progress

    def _try_complete(self, work: Work) -> bool:
        if work.kind is WorkKind.COMPUTE:
            work.complete_ns = _ready(work) + work.duration_ns
            return True
        if work.kind is WorkKind.COLLECTIVE:
            return self._try_collective(work)
        return self._try_p2p(work)

    def _try_collective(self, work: Work) -> bool:
        group = work.group or ""
        members = self.topology.groups[group].ranks
        works = self._collectives[(group, work.seq)]
        if len(works) < len(members) or any(w.ready_ns is None for w in works.values()):
            return False
        if len({w.signature for w in works.values()}) > 1:
            return False  # NCCL hangs (or worse) when members disagree on count or type
        done = max(_ready(w) for w in works.values()) + work.duration_ns
        for w in works.values():
            w.complete_ns = done
        return True

    def _try_p2p(self, work: Work) -> bool:
        latest = _ready(work)
        for key in work.pairs:
            sides = self._pair_sides.get(key, {})
            if len(sides) < 2:
                return False
            for side in sides.values():
                if side.ready_ns is None:
                    return False
                latest = max(latest, side.ready_ns)
        work.complete_ns = latest + work.duration_ns
        return True


def count_step(topology: Topology, programs: dict[int, list[ProgramItem]]) -> dict[int, RankCounters]:
    """How far one step moves each rank's counters; used to fast-forward a long-running job.

    Runs the same enqueue path as the simulation on fresh counters (no GPU, nothing completes),
    with every ``CpuSync`` skipped: counting needs no waiting.
    """
    quiet: dict[int, list[ProgramItem]] = {
        rank: [i for i in items if not isinstance(i, CpuSync)] for rank, items in programs.items()}
    sim = Simulation(topology, quiet, {rank: RankCounters() for rank in programs},
                     {rank: 0 for rank in programs})
    for rank in programs:
        sim._advance_cpu(rank)
    return sim.counters


def _ready(work: Work) -> int:
    if work.ready_ns is None:
        raise RuntimeError(f"rank {work.rank}: a work was completed before it reached the stream head")
    return work.ready_ns


def _sizes(call: CollectiveCall) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...],
                                         tuple[tuple[int, ...], ...], tuple[str, ...]]:
    return call.input_sizes, call.input_dtypes, call.output_sizes, call.output_dtypes


def _p2p_sizes(size: tuple[int, ...], dtype: str) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...],
                                                           tuple[tuple[int, ...], ...], tuple[str, ...]]:
    # pointToPoint records the tensor as both input and output.
    return (size,), (dtype,), (size,), (dtype,)


def _p2p_name(is_send: bool, me: int, peer: int) -> str:
    """``nccl:send 0->1`` / ``nccl:recv 1<-0``: group-local ranks, this rank first."""
    return f"nccl:send {me}->{peer}" if is_send else f"nccl:recv {me}<-{peer}"
