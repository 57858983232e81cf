"""Reduce one rank's Flight Recorder dump to a compact progress summary.

This is the scale rule: one streaming pass over the entries keeps, per process
group, only the sequence counters and the ops still in flight. Entries are read once and dropped;
only ``RankSummary`` objects cross process or task boundaries.

Worked example (Gloo, 2 entries in the world group ``"0"``)::

    entries: [{process_group: ("0", "default_pg"), collective_seq_id: 1, retired: True, ...},
              {process_group: ("0", "default_pg"), collective_seq_id: 2, retired: False,
               profiling_name: "gloo:all_reduce", ...}]
    summary.groups["0"]: last_enqueued=2, last_completed=1,
                         pending=[PendingOp(collective_seq_id=2, op="gloo:all_reduce", ...)]
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from itertools import islice
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from denpex.analysis.active_only import drop_closed_batch_members, left_out_completed
from denpex.analysis.op_rules import ROOTED_OPS
from denpex.analysis.rank_runs import RankRuns, parse_rank_list
from denpex.evidence.errors import DumpError
from denpex.evidence.fr_dump import DecodedDump, DumpEncoding

__all__ = [
    "OpState",
    "OpKind",
    "OpSignature",
    "PendingOp",
    "EarlierIncarnation",
    "GroupProgress",
    "RankSummary",
    "MAX_PENDING_PER_GROUP",
    "MAX_SIGNATURE_TENSORS",
    "MAX_TENSOR_DIMS",
    "summarize_dump",
]

# NCCL keeps enqueuing asynchronously while a rank waits, so in-flight ops can number in the
# hundreds; the oldest ones decide the hang, the rest only need counting.
MAX_PENDING_PER_GROUP = 16

_P2P_NAME = re.compile(r"(send|recv)\s+(\d{1,9})\s*(->|<-)\s*(\d{1,9})", re.ASCII)
# Torch keeps sequence ids, record ids, times and sizes in 64-bit ints. A value outside that range
# is corruption or forgery; refusing it also keeps every number printable and every time a date.
_INT64 = 1 << 63
# Real dtypes ("Float", "BFloat16") and op names are short; longer text is cut, never echoed whole.
_MAX_TEXT = 256
# A signature keeps at most this many tensors, and dims per tensor: real collectives carry a few
# tensors (coalesced ones some tens). Peers that differ only beyond that compare equal.
MAX_SIGNATURE_TENSORS = 256
MAX_TENSOR_DIMS = 16


class OpState(StrEnum):
    """Progress of one FR entry as recorded by torch."""

    SCHEDULED = "scheduled"
    """Enqueued; on Gloo (and NCCL without timing) this is the only state before retirement."""
    STARTED = "started"
    """The NCCL kernel started (only with ``TORCH_NCCL_ENABLE_TIMING=1``)."""
    COMPLETED = "completed"
    """Finished on this rank."""


class OpKind(StrEnum):
    """What kind of communication an entry is."""

    COLLECTIVE = "collective"
    """Counts in ``collective_seq_id``; every group member must call it."""
    SEND = "send"
    """Point-to-point send; counts in ``p2p_seq_id`` only."""
    RECV = "recv"
    """Point-to-point recv; counts in ``p2p_seq_id`` only."""


class OpSignature(BaseModel):
    """What was called: the op and its tensors' sizes and dtypes. Peers must agree on it."""

    model_config = ConfigDict(frozen=True)

    op: str
    input_sizes: tuple[tuple[int, ...], ...] = ()
    input_dtypes: tuple[str, ...] = ()
    output_sizes: tuple[tuple[int, ...], ...] = ()
    output_dtypes: tuple[str, ...] = ()

    def describe(self) -> str:
        """``gloo:all_reduce float32[1024]``: the op and its input tensors, for people."""
        tensors = ", ".join(
            f"{dtype}{list(size)}"
            for dtype, size in zip(self.input_dtypes, self.input_sizes, strict=False)
        )
        return f"{self.op} {tensors}".strip()


class PendingOp(BaseModel):
    """An op this rank enqueued that had not completed when it dumped."""

    model_config = ConfigDict(frozen=True)

    kind: OpKind
    collective_seq_id: int
    p2p_seq_id: int = -1
    signature: OpSignature
    state: OpState
    # Group-local ranks for point-to-point ops: ``nccl:send 0->1`` is local 0 sending to local 1.
    local_rank: int | None = None
    peer_local_rank: int | None = None
    in_batch: bool = False
    time_created_ns: int | None = None
    timeout_ms: int | None = None
    record_id: int | None = None


class EarlierIncarnation(BaseModel):
    """An incarnation of a group that its process destroyed before building the group again.

    c10d: ``destroy_process_group`` leaves the Flight Recorder ring alone, and the group built
    again takes a new ``pg_id`` (a per-process counter that only goes up) while Python gives it
    the same name, and its sequence ids restart at 1. The ring therefore holds both; their seq
    ids are unrelated, so only the newest incarnation is compared across ranks.
    """

    model_config = ConfigDict(frozen=True)

    pg_id: int | None
    last_enqueued: int
    last_completed: int
    entry_count: int
    # Ops still in flight when it was destroyed: the destroy aborted them, they never complete.
    abandoned: int = 0


class GroupProgress(BaseModel):
    """One rank's progress in one process group, keyed across ranks by the group name."""

    name: str
    desc: str | None = None
    pg_id: int | None = None
    # Global ranks from this rank's own pg_config (NCCL records them correctly; Gloo does not).
    config_ranks: RankRuns | None = None
    last_enqueued: int = -1
    last_completed: int = -1
    # The newest completed collective that needs every member to enter before it completes
    # anywhere: rooted ops (broadcast, reduce, gather, scatter) can finish on some members first.
    last_completed_by_all: int = -1
    last_p2p_enqueued: int = -1
    pending: list[PendingOp] = Field(default_factory=list)
    pending_dropped: int = 0
    # The newest collective this rank enqueued in the group, finished or not: after an op fails,
    # Gloo may mark it retired, and this is the only trace of what the rank was blocked in.
    last_op: PendingOp | None = None
    entry_count: int = 0
    # The ring holds more than one incarnation of the group: the process destroyed it and built it
    # again (an in-process restart), and the ring kept both. Only the newest is summarised here.
    pg_id_changed: bool = False
    earlier_incarnations: list[EarlierIncarnation] = Field(default_factory=list)
    # When the newest incarnation's first entry was created (set only when there were earlier ones).
    incarnation_started_ns: int | None = None

    def oldest_pending_collective(self) -> PendingOp | None:
        ops = [op for op in self.pending if op.kind is OpKind.COLLECTIVE]
        return min(ops, key=lambda op: op.collective_seq_id) if ops else None

    def pending_p2p(self) -> list[PendingOp]:
        return [op for op in self.pending if op.kind is not OpKind.COLLECTIVE]


class RankSummary(BaseModel):
    """Everything the comparison needs from one rank's dump, a few KB whatever the ring size."""

    rank: int
    source: str
    encoding: DumpEncoding
    version: str
    backend: str | None = None
    comm_lib_version: str | None = None
    entry_count: int = 0
    ring_wrapped: bool = False
    timing_enabled: bool = False
    newest_time_ns: int | None = None
    # The creation time of the oldest entry in the ring (the rank's first op when the ring did not
    # wrap): a dump whose whole history is newer than a peer's is from a later attempt.
    oldest_time_ns: int | None = None
    # When the dump was taken, where the dump itself shows it: NCCL stamps the ``time_discovered_*``
    # of ops that are still live with the dump's own query time.
    dumped_at_ns: int | None = None
    # The ``record_id`` of the newest entry: the last op the rank's CPU enqueued, in any group.
    newest_record_id: int | None = None
    def built_subgroup(self, world_size: int) -> bool | None:
        """Gloo only: whether the rank built a backend for a subgroup. ``"[]"`` (torch 2.13) or a
        list shorter than the world (torch 2.14's positions) says it did; the world's list says
        it did not; None when ``pg_config`` says neither."""
        if self.gloo_config_size is None:
            return None
        return self.gloo_config_size < world_size

    # The dump left its completed entries out (``onlyActive``; ``denpex.analysis.active_only``):
    # it holds every op the rank has in flight, and a group it shows no entry of has none.
    only_active: bool = False
    # Gloo only: how many ranks its ``pg_config`` lists, 0 for ``"[]"`` (``_gloo_config_size``).
    gloo_config_size: int | None = None
    # ``pg_status``: rank-local pg_id -> (last enqueued, last completed) work sequence number. It
    # outlives the ring (see ``_pg_status``).
    pg_status: dict[int, tuple[int, int]] = Field(default_factory=dict)
    groups: dict[str, GroupProgress] = Field(default_factory=dict)
    rejected_entries: dict[str, int] = Field(default_factory=dict)


def summarize_dump(dump: DecodedDump, *, rank: int,
                   rank_lists: dict[str, RankRuns | None] | None = None) -> RankSummary:
    """One pass over ``dump``'s entries; raises DumpError only if nothing usable is left.

    ``rank_lists`` caches parsed ``pg_config`` rank lists across the dumps of one batch.
    """
    raw = dump.raw
    scan = _Scan()
    entries = raw.get("entries") or []
    scan.run(entries)
    if entries and scan.accepted == 0:
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(scan.rejected.items()))
        raise DumpError(f"none of its {len(entries)} entries is usable ({reasons})")
    groups = scan.finish(entries)
    if scan.backend != "gloo":
        # Gloo records pg_config before Python names the group, so it is wrong there.
        _apply_pg_config(groups, raw.get("pg_config"), rank_lists if rank_lists is not None else {})
    return RankSummary(
        rank=rank,
        source=dump.source,
        encoding=dump.encoding,
        version=f"{dump.version[0]}.{dump.version[1]}",
        backend=scan.backend,
        comm_lib_version=_str_or_none(raw.get("comm_lib_version")),
        entry_count=scan.accepted,
        ring_wrapped=scan.min_record_id is not None and scan.min_record_id > 0,
        only_active=left_out_completed(entries, scan.saw_completed),
        timing_enabled=scan.timing_seen,
        newest_time_ns=scan.newest_ns,
        oldest_time_ns=_oldest_time(entries),
        newest_record_id=_newest_record_id(entries),
        gloo_config_size=_gloo_config_size(raw.get("pg_config")) if scan.backend == "gloo" else None,
        pg_status=_pg_status(raw.get("pg_status")),
        dumped_at_ns=scan.live_discovered_ns,
        groups=groups,
        rejected_entries=scan.rejected,
    )


class _GroupScan:
    """Mutable per-group accumulator; ``_Scan.finish`` freezes it into a GroupProgress."""

    __slots__ = ("name", "desc", "pg_id", "enq", "comp", "comp_all", "p2p_enq", "pending", "dropped", "count",
                 "last_entry", "earlier", "started_ns")

    def __init__(self, name: str, desc: str | None, pg_id: int | None) -> None:
        self.name, self.desc, self.pg_id = name, desc, pg_id
        self.enq = self.comp = self.comp_all = self.p2p_enq = -1
        self.pending: list[dict[str, Any]] = []
        self.dropped = 0
        self.count = 0
        self.last_entry: dict[str, Any] | None = None
        self.earlier: list[EarlierIncarnation] = []
        self.started_ns: int | None = None

    def next_incarnation(self, pg_id: int, e: dict[str, Any]) -> _GroupScan:
        """The group built again under ``pg_id``, starting at entry ``e``: this one is kept as an
        earlier incarnation, and counting starts over (its seq ids restart at 1)."""
        following = _GroupScan(self.name, self.desc, pg_id)
        following.earlier = [*self.earlier, EarlierIncarnation(
            pg_id=self.pg_id, last_enqueued=self.enq, last_completed=self.comp, entry_count=self.count,
            abandoned=sum(1 for p in self.pending if not _finished_by_later(p, self.comp)))]
        created = e.get("time_created_ns")
        following.started_ns = created if type(created) is int and 0 < created < _INT64 else None
        return following


class _Scan:
    """The streaming pass. Hot path: plain dict lookups and locals, no objects per entry."""

    def __init__(self) -> None:
        self.groups: dict[str, _GroupScan] = {}
        self.accepted = 0
        self.rejected: dict[str, int] = {}
        self.backend: str | None = None
        self.min_record_id: int | None = None
        self.newest_ns: int | None = None
        self.live_discovered_ns: int | None = None
        self.timing_seen = False
        self.saw_completed = False

    def reject(self, why: str) -> None:
        self.rejected[why] = self.rejected.get(why, 0) + 1

    def run(self, entries: list[Any]) -> None:  # noqa: C901 - one flat loop is the point
        groups = self.groups
        newest = 0
        min_record = None
        accepted = 0
        saw_done = False
        int64 = _INT64
        for e in entries:
            if type(e) is not dict:
                self.reject("entry is not a mapping")
                continue
            pg = e.get("process_group")
            csid = e.get("collective_seq_id")
            name = e.get("profiling_name")
            if type(pg) not in (tuple, list) or not pg or type(pg[0]) is not str:
                self.reject("no process_group name")
                continue
            if type(name) is not str:
                self.reject("no profiling_name")
                continue
            if type(csid) is not int or not 0 <= csid < int64:
                self.reject("collective_seq_id is not a non-negative int64")
                continue
            group = groups.get(pg[0])
            pg_id = e.get("pg_id")
            if group is None:
                group = groups[pg[0]] = self._new_group(pg, pg_id)
            elif pg_id != group.pg_id and type(pg_id) is int and group.pg_id is not None:
                # Another incarnation of the group (an in-process restart): count it afresh.
                group = groups[pg[0]] = group.next_incarnation(pg_id, e)
            accepted += 1
            group.count += 1
            record_id = e.get("record_id")
            if type(record_id) is int and (min_record is None or record_id < min_record):
                min_record = record_id
            created = e.get("time_created_ns")
            if type(created) is int and created > newest:
                newest = created
            # Completion is discovered after start, so it is the newer of the two.
            finished = e.get("time_discovered_completed_ns")
            if finished and type(finished) is int and finished > newest:
                newest = finished
            state = e.get("state")
            retired = e.get("retired") is True
            if not retired and state != "scheduled":
                self._note_live_discovery(e)
            done = retired or state == "completed"
            if done:
                saw_done = True
            if e.get("is_p2p") is True:
                psid = e.get("p2p_seq_id")
                if type(psid) is int and group.p2p_enq < psid < int64:
                    group.p2p_enq = psid
                if not done:
                    _keep_pending(group, e)
                continue
            if name.endswith("coalesced") and (
                    group.pending and _closes_p2p_batch(group, e, done) or _orphan_p2p_closer(group, e, csid)):
                continue
            if csid >= group.enq:
                group.enq = csid
                group.last_entry = e
            if done:
                if csid > group.comp:
                    group.comp = csid
                if csid > group.comp_all and name not in ROOTED_OPS:
                    group.comp_all = csid
                if group.pending:
                    group.pending = [p for p in group.pending if not _finished_by_later(p, csid)]
            else:
                _keep_pending(group, e)
        self.accepted += accepted
        self.saw_completed = saw_done
        self.min_record_id = min_record
        if newest >= int64:
            # Only a corrupt or forged dump gets here; kept out of the hot loop.
            newest = _newest_valid_time(entries)
        self.newest_ns = newest or None
        self._note_backend_and_timing(entries)

    def _new_group(self, pg: Any, pg_id: object) -> _GroupScan:
        desc = _short(pg[1]) if len(pg) > 1 and isinstance(pg[1], str) else None
        return _GroupScan(pg[0], desc, pg_id if type(pg_id) is int else None)

    def _note_backend_and_timing(self, entries: list[Any]) -> None:
        """Read off the first usable entries rather than testing every entry in the hot loop."""
        for e in entries:
            if type(e) is dict and type(e.get("profiling_name")) is str:
                self.backend = e["profiling_name"].partition(":")[0] or None
                break
        # With TORCH_NCCL_ENABLE_TIMING, completed entries carry a discovered start time.
        self.timing_seen = any(type(e) is dict and (e.get("state") == "started"
                                                   or e.get("time_discovered_started_ns"))
                               for e in entries[-64:])

    def _note_live_discovery(self, e: dict[str, Any]) -> None:
        for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            value = e.get(key)
            if type(value) is int and 0 < value < _INT64 and (self.live_discovered_ns is None
                                                              or value > self.live_discovered_ns):
                self.live_discovered_ns = value

    def finish(self, entries: list[Any]) -> dict[str, GroupProgress]:
        signatures = _SignatureCache()
        return {
            name: GroupProgress(
                name=name,
                desc=g.desc,
                pg_id=g.pg_id,
                last_enqueued=g.enq,
                last_completed=g.comp,
                last_completed_by_all=g.comp_all,
                last_p2p_enqueued=g.p2p_enq,
                pending=[_pending_op(e, signatures) for e in drop_closed_batch_members(g.pending, entries)
                         if not _finished_by_later(e, g.comp)],
                pending_dropped=g.dropped,
                last_op=_pending_op(g.last_entry, signatures) if g.last_entry is not None else None,
                entry_count=g.count,
                pg_id_changed=bool(g.earlier),
                earlier_incarnations=g.earlier,
                incarnation_started_ns=g.started_ns,
            )
            for name, g in self.groups.items()
        }


def _oldest_time(entries: list[Any]) -> int | None:
    """The first entry's creation time: the ring keeps entries in the order they were recorded."""
    for e in entries[:8]:
        created = e.get("time_created_ns") if type(e) is dict else None
        if type(created) is int and 0 < created < _INT64:
            return created
    return None


def _gloo_config_size(pg_config: object) -> int | None:
    """How many ranks Gloo's one ``pg_config`` entry lists (0 for ``"[]"``), read by a rule that
    needs no torch version (``compare`` decides with the world size what it means).

    Gloo records ``pg_config`` before Python names the group: one unnamed entry, overwritten by
    every backend the process builds; non-members of a subgroup build no backend. The default
    group's backend lists the world's ranks. A ``new_group`` backend records ``"[]"`` (torch 2.9
    to 2.13, measured) or the positions ``[0, ..., n-1]`` within that subgroup (torch 2.14,
    measured), never global ranks. So the full world list means the rank built no subgroup;
    ``[]`` or a list shorter than the world means it built one. None when it says neither.
    """
    if not isinstance(pg_config, dict) or len(pg_config) != 1:
        return None
    cfg = next(iter(pg_config.values()))
    text = cfg.get("ranks") if isinstance(cfg, dict) else None
    if not isinstance(text, str):
        return None
    if text.strip() == "[]":
        return 0
    runs = parse_rank_list(text)
    return sum(count for _, count, _ in runs) if runs else None


def _pg_status(pg_status: object) -> dict[int, tuple[int, int]]:
    """``pg_status`` as (last enqueued, last completed) per rank-local ``pg_id``: ints in a
    pickle, strings in JSON. A group is registered on its first recorded entry and never leaves,
    so the counters outlive the ring. What a count means differs by backend (Gloo numbers every
    op, sends and recvs too; NCCL holds the last op's seq id, a p2p one after a send or recv):
    ``compare.progress_from_status`` decides what may be read from it. Anything that is not a
    plain decimal number of at most 19 digits is skipped, never raised on (a hostile dump)."""
    out: dict[int, tuple[int, int]] = {}
    if not isinstance(pg_status, dict):
        return out
    for key, status in islice(pg_status.items(), 4096):
        pg_id = _small_int(key)
        if pg_id is None or pg_id < 0 or not isinstance(status, dict):
            continue
        enqueued = _small_int(status.get("last_enqueued_collective"))
        completed = _small_int(status.get("last_completed_collective"))
        if enqueued is not None and completed is not None and -1 <= completed <= enqueued:
            out[pg_id] = (enqueued, completed)
    return out


def _small_int(value: object) -> int | None:
    """An int, or its decimal text (JSON dumps), in ``[-1, 2**63)``; None for anything else."""
    if isinstance(value, str):
        digits = value[1:] if value.startswith("-") else value
        if not (0 < len(digits) <= 19 and digits.isascii() and digits.isdigit()):
            return None
        value = int(value)
    if type(value) is not int or not -1 <= value < _INT64:
        return None
    return value


def _newest_record_id(entries: list[Any]) -> int | None:
    """The last entry's ``record_id``: the ring keeps entries in the order they were recorded."""
    for e in reversed(entries[-8:]):
        record_id = e.get("record_id") if type(e) is dict else None
        if type(record_id) is int and 0 <= record_id < _INT64:
            return record_id
    return None


def _newest_valid_time(entries: list[Any]) -> int:
    """The newest creation or completion time that fits in torch's int64 nanoseconds."""
    return max((t for e in entries if type(e) is dict
                for t in (e.get("time_created_ns"), e.get("time_discovered_completed_ns"))
                if type(t) is int and 0 < t < _INT64), default=0)


def _keep_pending(group: _GroupScan, e: dict[str, Any]) -> None:
    if len(group.pending) < MAX_PENDING_PER_GROUP:
        group.pending.append(e)
    else:
        group.dropped += 1


def _closes_p2p_batch(group: _GroupScan, e: dict[str, Any], done: bool) -> bool:
    """A ``coalesced`` entry after p2p ops of the same ``p2p_seq_id`` carries their state.

    ``batch_isend_irecv`` records each send/recv without events, so they stay ``scheduled``
    forever; only the following coalesced entry tells whether the batch finished.
    """
    psid = e.get("p2p_seq_id")
    members = [p for p in group.pending if p.get("is_p2p") is True and p.get("p2p_seq_id") == psid]
    if not members:
        return False
    for member in members:
        group.pending.remove(member)
    if not done:
        group.pending.extend(dict(member, _in_batch=True) for member in members)
    return True


def _orphan_p2p_closer(group: _GroupScan, e: dict[str, Any], csid: int) -> bool:
    """A batched-p2p closer whose send/recv members are not in the ring (it wrapped between
    them) or were not kept. It is never a collective: p2p work does not advance
    ``collective_seq_id``, which starts at 1, so a closer at 0 closes a p2p batch (NCCL
    ``endCoalescing``; notes: testkit/generators/NCCL_FORMAT.md "Batched p2p"). Counted as collective #0 it would
    make a rank whose batches all completed look as if it waited on its pipeline peers.
    """
    if csid != 0 or e.get("is_p2p") is True:
        return False
    psid = e.get("p2p_seq_id")
    if type(psid) is int and group.p2p_enq < psid < _INT64:
        group.p2p_enq = psid
    return True


def _finished_by_later(e: dict[str, Any], last_completed: int) -> bool:
    """Members of a coalesced collective never get events; their closing entry's completion
    (same ``collective_seq_id``) or any later completed collective proves they finished."""
    return e.get("is_p2p") is not True and e["collective_seq_id"] <= last_completed


def _pending_op(e: dict[str, Any], signatures: _SignatureCache) -> PendingOp:
    name: str = e["profiling_name"]
    kind, local, peer = OpKind.COLLECTIVE, None, None
    if e.get("is_p2p") is True:
        match = _P2P_NAME.search(name)
        if match:
            verb, a, arrow, b = match.groups()
            kind = OpKind.SEND if verb == "send" else OpKind.RECV
            # "send 0->1": self is 0; "recv 1<-0": self is 1. Either way the left side is self.
            local, peer = int(a), int(b)
            del arrow
        else:
            kind = OpKind.RECV if "recv" in name else OpKind.SEND
    state = e.get("state")
    psid = _positive_int(e.get("p2p_seq_id"), allow_zero=True)
    return PendingOp(
        kind=kind,
        collective_seq_id=e["collective_seq_id"],
        p2p_seq_id=psid if psid is not None else -1,
        signature=signatures.get(e),
        state=OpState(state) if state in ("scheduled", "started", "completed") else OpState.SCHEDULED,
        local_rank=local,
        peer_local_rank=peer,
        in_batch=bool(e.get("_in_batch")),
        time_created_ns=_positive_int(e.get("time_created_ns")),
        # A timeout of zero or less is not one torch writes; read as "timed out long ago", it
        # would make every op overdue and blame healthy ranks.
        timeout_ms=_positive_int(e.get("timeout_ms")),
        record_id=_positive_int(e.get("record_id"), allow_zero=True),
    )


class _SignatureCache:
    """Signatures of one dump. A pickle can make thousands of entries share one huge size list
    for a few bytes each; converting each raw value once (by identity: the cache holds it, so its
    ``id`` stays valid) and sharing equal signatures keeps the cost proportional to the file, not
    to what its references expand to."""

    __slots__ = ("_fields", "_signatures")

    def __init__(self) -> None:
        self._fields: dict[int, tuple[object, tuple[Any, ...]]] = {}
        self._signatures: dict[tuple[str, int, int, int, int], OpSignature] = {}

    def get(self, e: dict[str, Any]) -> OpSignature:
        parts = (self._field(e.get("input_sizes"), _sizes), self._field(e.get("input_dtypes"), _dtypes),
                 self._field(e.get("output_sizes"), _sizes), self._field(e.get("output_dtypes"), _dtypes))
        op = _short(e["profiling_name"])
        key = (op, id(parts[0]), id(parts[1]), id(parts[2]), id(parts[3]))
        signature = self._signatures.get(key)
        if signature is None:
            # The parts are already checked tuples of ints and strs; validating would copy them.
            signature = self._signatures[key] = OpSignature.model_construct(
                op=op, input_sizes=parts[0], input_dtypes=parts[1], output_sizes=parts[2],
                output_dtypes=parts[3])
        return signature

    def _field(self, raw: object, convert: Callable[[object], tuple[Any, ...]]) -> tuple[Any, ...]:
        hit = self._fields.get(id(raw))
        if hit is None:
            hit = self._fields[id(raw)] = (raw, convert(raw))
        return hit[1]


def _sizes(value: object) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(
        tuple(d for d in size[:MAX_TENSOR_DIMS] if type(d) is int and 0 <= d < _INT64)
        for size in value[:MAX_SIGNATURE_TENSORS] if isinstance(size, (list, tuple))
    )


def _dtypes(value: object) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    # Only text is a dtype. ``str()`` of anything else could walk a hostile, deeply nested list.
    return tuple(_short(d) if type(d) is str else f"<{type(d).__name__}>"
                 for d in value[:MAX_SIGNATURE_TENSORS])


def _short(text: str) -> str:
    """Text from a dump (an op name, a dtype, a group description), bounded and printable: a
    control or invisible character (a terminal escape, a bidi override) is written out as its
    code (``\\x1b``, ``\\u202e``), since reports and the CLI print these names."""
    cut = text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + "..."
    if cut.isprintable():
        return cut
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in cut)


def _positive_int(value: object, *, allow_zero: bool = False) -> int | None:
    if type(value) is int and (0 < value < _INT64 or (allow_zero and value == 0)):
        return value
    return None


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _apply_pg_config(groups: dict[str, GroupProgress], pg_config: object,
                     cache: dict[str, RankRuns | None]) -> None:
    """Attach NCCL's per-group global ranks. ``cache`` spares re-parsing the lists that every
    dump of a job repeats (the world's is ~190 KB of text at 32k ranks)."""
    if not isinstance(pg_config, dict):
        return
    for key, cfg in pg_config.items():
        if not isinstance(cfg, dict):
            continue
        name = cfg.get("name", key)
        text = cfg.get("ranks")
        if isinstance(text, str):
            if text not in cache:
                cache[text] = parse_rank_list(text)
            ranks = cache[text]
        else:
            ranks = parse_rank_list(text)
        if not isinstance(name, str) or not name or not ranks:
            continue
        group = groups.get(name)
        if group is None:
            desc = cfg.get("desc")
            group = groups[name] = GroupProgress(name=name, desc=_short(desc) if isinstance(desc, str) else None)
        group.config_ranks = ranks
