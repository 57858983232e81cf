"""Expand one real Flight Recorder dump into an N-rank, 3D-parallel dump set with an injected fault.

The shape comes from a real dump (``testkit.generators.fr_template``): the entry fields and their
order, the stacks, the dtype, the thread name and id, the timeout. Only what differs between
ranks and ops is written anew: sequence ids, group names, sizes, states, timestamps and record
ids. The job and its hang come from ``testkit.generators.hang_model``.

The dumps are NCCL-style (what production jobs write; see ``notes/flight-recorder.md``):

- ``pg_config`` lists the rank's four groups (world ``"0"``/``default_pg`` and hashed-name
  ``mesh_tp``, ``mesh_dp``, ``mesh_pp`` groups) with **global** ranks, as NCCL writes it, so that
  torch's analyzer reads the same files; ``pg_status`` is keyed by the rank-local ``pg_id``
  (world 0, tp 1, dp 2, pp 3) and counts p2p sequence numbers for the pipeline group;
- names are ``nccl:all_reduce``, ``nccl:_reduce_scatter_base``, ``nccl:_all_gather_base``, and
  NCCL-style point-to-point entries ``nccl:send 0->1`` / ``nccl:recv 1<-0`` with group-local
  ranks, ``is_p2p=True``, a per-rank ``p2p_seq_id`` and ``collective_seq_id`` 0 (the pipeline
  group carries no collectives); p2p ops record the tensor as input and output;
- timing is on (``TORCH_NCCL_ENABLE_TIMING=1``): finished ops are ``completed``, retired and carry
  ``duration_ms``; the op a rank is blocked in is ``started``, not retired, and its
  ``time_discovered_started_ns`` is the dump time; one dump moment for the whole set, a
  collective timeout (600 s) after the hang, with a per-rank clock skew under 1 ms;
- every ring is full and has wrapped: ``record_id`` does not start at 0.

Files: ``<prefix><rank>`` per rank (default ``comm_lib_trace_rank_``, no extension, as NCCL names
them), ``manifest.json`` (the ``denpex.evidence.manifest`` schema: hosts of 8 GPUs, every process
group) and ``expected.json``::

    {"scenario": "stalled", "verdict": "localized", "culprits": {"2573": "stalled"},
     "missing_ranks": [], "fault_op": "bwd[3].all_reduce[1]"}

Speed: ranks with the same stage and state at dump time share one encoded ring. Per rank, only
the header (``pg_config``, ``pg_status``) is encoded; the ring's bytes are copied with the memo
slots of the rank's group names and the timestamps patched (``testkit.generators.torch_pickle``
explains the layout). 4,096 ranks x 2,000 entries take a few seconds on two processes.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import queue
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from denpex.analysis.models import CandidateKind, Verdict
from testkit.generators.fr_template import DumpTemplate
from testkit.generators.hang_model import (
    SCENARIOS,
    SHARD_ELEMENTS,
    ExpansionError,
    FaultMode,
    GroupKind,
    ParallelLayout,
    PlannedOp,
    RankState,
    Scenario,
    culprit_rank,
    fault_for,
    simulate_last_step,
    stage_program,
)
from testkit.generators.torch_pickle import TorchPickleWriter, shared_frame_ids

__all__ = [
    "ExpectedOutcome",
    "GeneratedSet",
    "expected_outcome",
    "generate_dump_set",
    "DEFAULT_PREFIX",
    "NCCL_VERSION",
]

DEFAULT_PREFIX = "comm_lib_trace_rank_"
NCCL_VERSION = "2.27.5"
_SCHEMA_VERSION = "2.10"
_STEP_NS = 1_500_000_000
_COLLECTIVE_TIMEOUT_NS = 600 * 1_000_000_000
# 2026-11-29T18:00:00Z: a fixed clock, so that generated sets are reproducible.
_T0_NS = int(datetime(2026, 11, 29, 18, 0, tzinfo=UTC).timestamp()) * 1_000_000_000
_PG_ID = {GroupKind.WORLD: 0, GroupKind.TP: 1, GroupKind.DP: 2, GroupKind.PP: 3}
_SUBGROUPS = (GroupKind.TP, GroupKind.DP, GroupKind.PP)
_WORLD_NAME = "0"


@dataclass(frozen=True)
class ExpectedOutcome:
    """What a correct triage of the set says (``expected.json``)."""

    scenario: Scenario
    verdict: Verdict
    culprits: dict[int, CandidateKind]
    missing_ranks: list[int]
    fault_op: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario.value,
            "verdict": self.verdict.value,
            "culprits": {str(r): k.value for r, k in sorted(self.culprits.items())},
            "missing_ranks": self.missing_ranks,
            "fault_op": self.fault_op,
        }


@dataclass(frozen=True)
class GeneratedSet:
    """A written dump set."""

    path: Path
    world_size: int
    files: int
    bytes_written: int
    seconds: float
    expected: ExpectedOutcome
    states: dict[str, int]
    """How many ranks ended in each ``RankState`` (DONE, WAITING, STALLED, FROZEN)."""


def expected_outcome(layout: ParallelLayout, scenario: Scenario) -> ExpectedOutcome:
    spec = SCENARIOS[scenario]
    rank = culprit_rank(layout, scenario)
    if spec is None or rank is None:
        return ExpectedOutcome(scenario, Verdict.NO_HANG, {}, [], None)
    return ExpectedOutcome(
        scenario, spec.verdict, {rank: spec.kind}, [] if spec.dumps else [rank], spec.label
    )


# ---------------------------------------------------------------------------------------------
# Entries of one rank
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _RankClass:
    """Ranks with the same stage and state at dump time have the same ring, up to group names
    and clocks."""

    stage: int
    pos: int
    state: RankState
    mismatched: bool


def _ring(
    cls: _RankClass,
    program: list[PlannedOp],
    names: Mapping[GroupKind, tuple[str, str]],
    template: DumpTemplate,
    steps: int,
    ring_size: int,
    dump_ns: int,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
    """The rank's last ``ring_size`` entries and its ``pg_status``."""
    in_flight = cls.state in (RankState.WAITING, RankState.STALLED)
    total = (steps - 1) * len(program) + cls.pos + (1 if in_flight else 0)
    first = max(0, total - ring_size)
    enqueued = dict.fromkeys(GroupKind, 0)
    completed = dict.fromkeys(GroupKind, 0)
    gap = _STEP_NS // (len(program) + 1)
    entries: list[dict[str, Any]] = []
    record_id = 0
    for step in range(steps):
        last = step == steps - 1
        for i, op in enumerate(program):
            if last and (i > cls.pos or (i == cls.pos and not in_flight)):
                break
            finished = not (last and i == cls.pos)
            enqueued[op.kind] += 1
            completed[op.kind] += finished
            if record_id >= first:
                entries.append(_entry(
                    op, cls.stage, record_id, names[op.kind], enqueued[op.kind],
                    _T0_NS + step * _STEP_NS + (i + 1) * gap, gap,
                    None if finished else dump_ns, template,
                    mismatched=cls.mismatched and not finished,
                ))
            record_id += 1
    # In the p2p-only pipeline group these count p2p sequence numbers, as NCCL's do.
    status = {
        str(_PG_ID[kind]): {
            "last_enqueued_collective": enqueued[kind],
            "last_started_collective": enqueued[kind],
            "last_completed_collective": completed[kind],
        }
        for kind in GroupKind
    }
    return entries, status


def _entry(
    op: PlannedOp,
    stage: int,
    record_id: int,
    pg: tuple[str, str],
    seq: int,
    created: int,
    gap: int,
    stuck_since: int | None,
    template: DumpTemplate,
    *,
    mismatched: bool,
) -> dict[str, Any]:
    """One entry, with torch's field order. ``stuck_since`` is the dump time of an op in flight."""
    is_p2p = op.kind is GroupKind.PP
    if is_p2p:
        arrow = f"{stage}->{op.peer}" if op.name == "send" else f"{stage}<-{op.peer}"
        profiling = f"nccl:{op.name} {arrow}"
    else:
        profiling = f"nccl:{op.name}"
    sizes_in, sizes_out = op.sizes_in, op.sizes_out
    if mismatched:
        # Eight more elements per shard than the peers: a size mismatch at the same seq id.
        sizes_in = [[n + 8 * max(1, n // SHARD_ELEMENTS) for n in s] for s in sizes_in]
        sizes_out = [[n + 8 * max(1, n // SHARD_ELEMENTS) for n in s] for s in sizes_out]
    entry: dict[str, Any] = {
        "frames": template.frames[op.stack],
        "record_id": record_id,
        "pg_id": _PG_ID[op.kind],
        "process_group": pg,
        "thread_name": template.thread_name,
        "thread_id": template.thread_id,
        "collective_seq_id": 0 if is_p2p else seq,
        "p2p_seq_id": seq if is_p2p else 0,
        "op_id": seq,
        "profiling_name": profiling,
        "time_created_ns": created,
    }
    busy = gap * 6 // 10
    if stuck_since is None:
        entry["duration_ms"] = (busy - 50_000) / 1e6
    entry["input_sizes"] = sizes_in
    entry["input_dtypes"] = [template.dtype] * len(sizes_in)
    entry["output_sizes"] = sizes_out
    entry["output_dtypes"] = [template.dtype] * len(sizes_out)
    entry["state"] = "completed" if stuck_since is None else "started"
    entry["time_discovered_started_ns"] = created + 50_000 if stuck_since is None else stuck_since
    entry["time_discovered_completed_ns"] = created + busy if stuck_since is None else None
    entry["retired"] = stuck_since is None
    entry["timeout_ms"] = template.timeout_ms
    entry["is_p2p"] = is_p2p
    return entry


# ---------------------------------------------------------------------------------------------
# Encoding: one ring per class, patched per rank
# ---------------------------------------------------------------------------------------------
@dataclass
class _EncodedClass:
    header_memo: int
    slots: dict[GroupKind, tuple[int, int]]
    """(name slot, desc slot) of each subgroup in the representative rank's header."""
    name_refs: dict[GroupKind, np.ndarray]
    desc_refs: dict[GroupKind, np.ndarray]
    stamp_bytes: np.ndarray
    """(k, 8) byte indices of the LONG1 payloads (the timestamps) in ``body``."""
    body: bytes
    """The entries, without header and trailer."""
    trailer: bytes
    pg_status: dict[str, dict[str, int]]


@dataclass
class _Plan:
    layout: ParallelLayout
    template: DumpTemplate
    programs: list[list[PlannedOp]]
    steps: int
    ring_size: int
    dump_ns: int
    prefix: str
    names: dict[GroupKind, list[str]]
    rank_strings: dict[GroupKind, list[str]]
    classes: list[_RankClass]
    class_of: np.ndarray
    encoded: dict[int, _EncodedClass] = field(default_factory=dict)


def _group_name(ranks: Sequence[int]) -> str:
    # torch's hashed group names (split_group / DeviceMesh): sha1 of the ranks joined by "_".
    return hashlib.sha1("_".join(map(str, ranks)).encode()).hexdigest()


def _group_names(plan: _Plan, rank: int) -> dict[GroupKind, tuple[str, str]]:
    names = {GroupKind.WORLD: (_WORLD_NAME, GroupKind.WORLD.value)}
    for kind in _SUBGROUPS:
        names[kind] = (plan.names[kind][plan.layout.group_index(kind, rank)], kind.value)
    return names


def _pg_config(plan: _Plan, rank: int) -> dict[str, dict[str, str]]:
    rows = []
    for kind in GroupKind:
        idx = plan.layout.group_index(kind, rank)
        name = _WORLD_NAME if kind is GroupKind.WORLD else plan.names[kind][idx]
        rows.append((name, kind.value, plan.rank_strings[kind][idx]))
    rows.sort()  # torch keeps pg_config in a std::map keyed by (name, desc)
    return {name: {"name": name, "desc": desc, "ranks": ranks} for name, desc, ranks in rows}


def _write_header(
    writer: TorchPickleWriter, plan: _Plan, rank: int, pg_status: Mapping[str, Any]
) -> None:
    """Everything before the first entry: the top-level dict up to the open entries list."""
    writer.begin()
    writer.out += b"}("
    writer.string("version")
    writer.string(_SCHEMA_VERSION)
    writer.string("pg_config")
    writer.mapping(_pg_config(plan, rank))
    writer.string("comm_lib_version")
    writer.string(NCCL_VERSION)
    writer.string("pg_status")
    writer.mapping(pg_status)
    writer.string("entries")
    writer.out += b"]("


def _encode_class(plan: _Plan, index: int, rank: int) -> _EncodedClass:
    """Encode ``rank``'s whole dump and remember where the bytes that vary by rank sit."""
    cls = plan.classes[index]
    names = _group_names(plan, rank)
    entries, pg_status = _ring(cls, plan.programs[cls.stage], names, plan.template, plan.steps,
                               plan.ring_size, plan.dump_ns)
    watch = {s for kind in _SUBGROUPS for s in names[kind]}
    writer = TorchPickleWriter(watch=watch, shared_frames=shared_frame_ids(entries))
    _write_header(writer, plan, rank, pg_status)
    start = len(writer.out)
    slots = {}
    for kind in _SUBGROUPS:
        name_slot, desc_slot = (writer.slot_of(s) for s in names[kind])
        if name_slot is None or desc_slot is None or max(name_slot, desc_slot) > 255:
            raise ExpansionError(f"group {names[kind]} did not land in a 1-byte memo slot")
        slots[kind] = (name_slot, desc_slot)
    header_memo = writer.memo_count
    writer.slot_refs = {s: [] for s in watch}  # only references inside the entries count
    writer.long_payloads = []
    for entry in entries:
        writer.mapping(entry)
    body = bytes(writer.out[start:])
    stamps = np.asarray(writer.long_payloads, dtype=np.int64) - start
    writer.out = bytearray(b"eu")  # close the entries list and the top-level dict
    writer.put_memo()
    writer.end()

    def refs(s: str) -> np.ndarray:
        return np.asarray(writer.slot_refs[s], dtype=np.int64) - start

    return _EncodedClass(
        header_memo=header_memo,
        slots=slots,
        name_refs={kind: refs(names[kind][0]) for kind in _SUBGROUPS},
        desc_refs={kind: refs(names[kind][1]) for kind in _SUBGROUPS},
        stamp_bytes=stamps[:, None] + np.arange(8, dtype=np.int64)[None, :],
        body=body,
        trailer=bytes(writer.out),
        pg_status=pg_status,
    )


def _skew_ns(rank: int) -> int:
    # Hosts' clocks differ a little; keep it under a millisecond and deterministic.
    return (rank * 7919) % 1_000_000


def _rank_bytes(plan: _Plan, rank: int) -> list[bytes | bytearray]:
    index = int(plan.class_of[rank])
    enc = plan.encoded[index]
    header = TorchPickleWriter()
    _write_header(header, plan, rank, enc.pg_status)
    if header.memo_count != enc.header_memo:
        # Not expected with this layout: a header that memoizes differently would shift every
        # slot, so encode this rank whole instead of patching.
        enc = _encode_class(plan, index, rank)
    names = _group_names(plan, rank)
    body = bytearray(enc.body)
    arr = np.frombuffer(body, dtype=np.uint8)
    for kind in _SUBGROUPS:
        name_slot, desc_slot = (header.required_slot(s) for s in names[kind])
        if name_slot != enc.slots[kind][0]:
            arr[enc.name_refs[kind]] = name_slot
        if desc_slot != enc.slots[kind][1]:
            arr[enc.desc_refs[kind]] = desc_slot
    skew = _skew_ns(rank)
    if skew and enc.stamp_bytes.size:
        stamps = np.ascontiguousarray(arr[enc.stamp_bytes]).view("<i8")
        stamps += skew
        arr[enc.stamp_bytes] = stamps.view(np.uint8).reshape(enc.stamp_bytes.shape)
    return [header.out, body, enc.trailer]


def _write_ranks(plan: _Plan, ranks: Sequence[int], out_dir: Path) -> int:
    written = 0
    for rank in ranks:
        parts = _rank_bytes(plan, rank)
        with open(out_dir / f"{plan.prefix}{rank}", "wb") as fh:
            for part in parts:
                fh.write(part)
        written += sum(len(p) for p in parts)
    return written


def _writer_process(plan: _Plan, ranks: Sequence[int], out_dir: Path, results: Any) -> None:
    try:
        results.put(("ok", _write_ranks(plan, ranks, out_dir)))
    except BaseException:  # report to the parent, which raises; a silent child would stall it
        results.put(("error", traceback.format_exc()))


def _write_all(plan: _Plan, ranks: list[int], out_dir: Path, workers: int) -> int:
    if workers <= 1 or len(ranks) < 2 * workers:
        return _write_ranks(plan, ranks, out_dir)
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    # Forked children inherit the plan (with its encoded rings) without pickling it.
    procs = [ctx.Process(target=_writer_process, args=(plan, ranks[i::workers], out_dir, results))
             for i in range(workers)]
    for p in procs:
        p.start()
    total, errors, pending = 0, [], len(procs)
    while pending:
        try:
            kind, value = results.get(timeout=5)
        except queue.Empty:
            # A child killed by a signal (e.g. the OOM killer) reports nothing: don't wait forever.
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                errors += [f"writer pid {p.pid} exited with {p.exitcode}" for p in dead]
                break
            continue
        pending -= 1
        if kind == "ok":
            total += value
        else:
            errors.append(value)
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    if errors:
        raise ExpansionError("a dump writer process failed:\n" + "\n".join(errors))
    return total


# ---------------------------------------------------------------------------------------------
# Public entry point
# ---------------------------------------------------------------------------------------------
def _manifest(plan: _Plan, scenario: Scenario, groups: Mapping[GroupKind, list[list[int]]]
              ) -> dict[str, Any]:
    n = plan.layout.world_size
    process_groups: dict[str, Any] = {
        _WORLD_NAME: {"desc": GroupKind.WORLD.value, "ranks": list(range(n))}
    }
    for kind in _SUBGROUPS:
        for name, members in zip(plan.names[kind], groups[kind], strict=True):
            process_groups[name] = {"desc": kind.value, "ranks": members}
    return {
        "job_id": f"synthetic-{scenario.value}-{n}",
        "world_size": n,
        "ranks": {
            str(r): {"host": f"gpu-node-{r // 8:05d}", "local_rank": r % 8, "gpu_index": r % 8}
            for r in range(n)
        },
        "process_groups": process_groups,
    }


def generate_dump_set(
    out_dir: Path,
    *,
    world_size: int,
    scenario: Scenario,
    template: DumpTemplate,
    ring_size: int = 2000,
    tp: int = 8,
    pp: int = 4,
    prefix: str = DEFAULT_PREFIX,
    workers: int = 2,
    manifest: bool = True,
) -> GeneratedSet:
    """Write a ``world_size``-rank dump set for ``scenario`` into ``out_dir`` (created if needed).

    ``workers`` forked processes write disjoint ranks; 1 writes in this process. A rank that
    the scenario silences (``Scenario.MISSING``) gets no file.
    """
    if ring_size < 1:
        raise ExpansionError(f"ring_size {ring_size} must be at least 1")
    started = time.perf_counter()
    layout = ParallelLayout(world_size, tp=tp, pp=pp)
    programs = [stage_program(s, pp, layout.dp) for s in range(pp)]
    steps = ring_size // min(len(p) for p in programs) + 3  # every ring wraps
    fault = fault_for(layout, scenario, programs)
    pos, states = simulate_last_step(layout, programs, fault)
    mismatch_rank = fault.rank if fault and fault.mode is FaultMode.MISMATCH else None
    class_index: dict[_RankClass, int] = {}
    class_of = np.empty(world_size, dtype=np.int32)
    for r in range(world_size):
        cls = _RankClass(layout.coords(r)[0], pos[r], states[r], r == mismatch_rank)
        class_of[r] = class_index.setdefault(cls, len(class_index))
    groups = {kind: layout.groups(kind) for kind in _SUBGROUPS}
    names = {kind: [_group_name(m) for m in groups[kind]] for kind in _SUBGROUPS}
    rank_strings = {kind: [str(m) for m in groups[kind]] for kind in _SUBGROUPS}
    rank_strings[GroupKind.WORLD] = [str(list(range(world_size)))]
    # One dump moment for the whole set: a collective timeout after the hang, or a second after
    # the last step when nothing hangs.
    dump_ns = _T0_NS + steps * _STEP_NS + (_COLLECTIVE_TIMEOUT_NS if fault else 1_000_000_000)
    plan = _Plan(layout, template, programs, steps, ring_size, dump_ns, prefix, names,
                 rank_strings, list(class_index), class_of)
    # Encode each class once, before forking, so that the writers share the encoded rings.
    for r in range(world_size):
        idx = int(class_of[r])
        if idx not in plan.encoded:
            plan.encoded[idx] = _encode_class(plan, idx, r)
    expected = expected_outcome(layout, scenario)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [r for r in range(world_size) if r not in expected.missing_ranks]
    written = _write_all(plan, todo, out_dir, workers)
    if manifest:
        (out_dir / "manifest.json").write_text(json.dumps(_manifest(plan, scenario, groups)))
    (out_dir / "expected.json").write_text(json.dumps(expected.to_json(), indent=1))
    counts = dict.fromkeys((s.name for s in RankState), 0)
    for s in states:
        counts[s.name] += 1
    return GeneratedSet(out_dir, world_size, len(todo), written, time.perf_counter() - started,
                        expected, counts)
