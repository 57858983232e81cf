"""Deterministic NCCL Flight Recorder fixtures for a 64-rank 3D-parallel job.

No GPU here can produce a multi-rank NCCL dump, so this module simulates one (``nccl_sim``) and
writes what torch 2.13 would have written (``nccl_dump``; the format is in ``NCCL_FORMAT.md``),
plus the job manifest and the ground truth::

    python -m testkit.generators.nccl_fixtures OUT_DIR [--scenario NAME ...] [--format pickle|json|both]

    OUT_DIR/<scenario>/<format>/comm_lib_trace_rank_<rank>[.json]
                               /manifest.json
                               /expected.json   {"verdict": ..., "culprits": {"<rank>": "<kind>"}}

The same inputs always give byte-identical files.
"""

from __future__ import annotations

import argparse
import sys
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from denpex.evidence.manifest import JobManifest, ProcessGroupSpec, RankIdentity
from testkit.generators.nccl_dump import DumpFormat, DumpSettings, encode_dump, rank_dump
from testkit.generators.nccl_program import Hang, P2PMode, ProgramItem, StepPlan, build_step
from testkit.generators.nccl_scenarios import (
    SCENARIOS,
    DumpTrigger,
    Expected,
    Fault,
    FaultKind,
    ScenarioSpec,
    scenario_names,
)
from testkit.generators.nccl_sim import RankCounters, Simulation, count_step
from testkit.generators.nccl_topology import GroupKind, Topology, build_topology

__all__ = [
    "BASE_STEP",
    "WINDOW_STEPS",
    "WINDOW_START",
    "BuiltScenario",
    "build_scenario",
    "write_scenario",
    "dump_file_name",
    "p2p_mode_for",
    "main",
]

BASE_STEP = 52_000  # steps the job ran before the simulated window
WINDOW_STEPS = 5  # simulated steps; a fault is in the last one
WINDOW_START = datetime(2026, 11, 29, 18, 35, 0, tzinfo=UTC)
STALE_AGE_NS = 3_600 * 10**9
_MS = 1_000_000
_BUS_IDS = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
            "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0")


@dataclass(frozen=True, slots=True)
class BuiltScenario:
    """A scenario built in memory: one pickle-form dump per rank that left one, and the truth."""

    spec: ScenarioSpec
    topology: Topology
    simulation: Simulation
    dumps: dict[int, dict[str, Any]]
    dump_ns: dict[int, int]  # wall-clock ns of each dump
    manifest: JobManifest
    expected: Expected

    @property
    def missing_ranks(self) -> list[int]:
        return [r for r in range(self.topology.layout.world_size) if r not in self.dumps]


def p2p_mode_for(step: int) -> P2PMode:
    """The job alternates: even steps use ``batch_isend_irecv``, odd steps plain send/recv."""
    return P2PMode.BATCHED if step % 2 == 0 else P2PMode.PLAIN


def build_scenario(name: str) -> BuiltScenario:
    """Simulate scenario ``name`` and take every live rank's dump."""
    spec = _spec(name)
    topology = build_topology(spec.layout)
    settings = DumpSettings(epoch_ns=_epoch_ns(WINDOW_START), timing=spec.timing, ring_size=spec.ring_size)
    programs = _programs(topology, spec, with_faults=True)
    sim = _simulate(topology, programs, BASE_STEP)
    dump_at = _dump_times(sim, spec)
    if spec.trigger is not DumpTrigger.TIMEOUT and any(sim.incomplete(r) for r in sim.programs):
        raise RuntimeError(f"scenario {name!r}: the healthy simulation did not finish")
    no_dump = {r for f in spec.faults if f.kind is FaultKind.DIE for r in f.ranks}
    stale = {r for f in spec.faults if f.kind is FaultKind.STALE for r in f.ranks}
    dumps = {r: rank_dump(sim, r, t, settings) for r, t in dump_at.items() if r not in no_dump | stale}
    short = sorted(r for r, d in dumps.items() if len(d["entries"]) < spec.ring_size)
    if short:
        # After ~52,000 steps every ring is full; a short one would contradict its record_ids.
        raise RuntimeError(f"scenario {name!r}: ranks {short} recorded fewer than {spec.ring_size} "
                           "entries in the window; simulate more steps or shrink the ring")
    dump_ns = {r: settings.epoch_ns + dump_at[r] for r in dumps}
    if stale:
        old, old_ns = _stale_dumps(topology, spec, sim, stale)
        dumps.update(old)
        dump_ns.update(old_ns)
    dumps = dict(sorted(dumps.items()))
    return BuiltScenario(spec=spec, topology=topology, simulation=sim, dumps=dumps,
                         dump_ns=dict(sorted(dump_ns.items())),
                         manifest=_manifest(spec, topology, dump_ns), expected=spec.expected())


def dump_file_name(rank: int, fmt: DumpFormat) -> str:
    """torch's default ``<prefix><rank>``; the JSON variant gets a ``.json`` extension."""
    name = f"comm_lib_trace_rank_{rank}"
    return name + ".json" if fmt is DumpFormat.JSON else name


def write_scenario(built: BuiltScenario, directory: Path, fmt: DumpFormat, *,
                   file_name: Callable[[int, DumpFormat], str] = dump_file_name,
                   order: Sequence[int] | None = None,
                   manifest_names_files: bool = False) -> Path:
    """Write the dumps, ``manifest.json`` and ``expected.json`` into ``directory``.

    ``order`` changes the order files are created in; ``file_name`` renames them, and with
    ``manifest_names_files`` the manifest maps each rank to its file (``ranks[r].dump_file``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    ranks = list(order) if order is not None else list(built.dumps)
    if sorted(ranks) != sorted(built.dumps):
        raise ValueError(f"order must list exactly the ranks with dumps: {sorted(built.dumps)}")
    for rank in ranks:
        (directory / file_name(rank, fmt)).write_bytes(encode_dump(built.dumps[rank], fmt))
    manifest = built.manifest
    if manifest_names_files:
        ranks_with_files = {
            r: identity.model_copy(update={"dump_file": file_name(r, fmt)}) if r in built.dumps else identity
            for r, identity in manifest.ranks.items()
        }
        manifest = manifest.model_copy(update={"ranks": ranks_with_files})
    (directory / "manifest.json").write_text(manifest.model_dump_json(indent=1, exclude_none=True) + "\n")
    (directory / "expected.json").write_text(built.expected.model_dump_json(indent=1) + "\n")
    return directory


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m testkit.generators.nccl_fixtures",
                                     description="Write simulated NCCL Flight Recorder dumps.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--scenario", action="append", choices=scenario_names(),
                        help="scenario to build (repeatable; default: all)")
    parser.add_argument("--format", choices=["pickle", "json", "both"], default="both")
    args = parser.parse_args(argv)
    formats = [DumpFormat.PICKLE, DumpFormat.JSON] if args.format == "both" else [DumpFormat(args.format)]
    for name in args.scenario or scenario_names():
        built = build_scenario(name)
        for fmt in formats:
            path = write_scenario(built, args.out_dir / name / fmt.value, fmt)
            print(f"{path}: {len(built.dumps)} dumps, expected {built.expected.verdict.value} "
                  f"{ {r: k.value for r, k in built.expected.culprits.items()} }")
    return 0


# -- building blocks -------------------------------------------------------------------------


def _spec(name: str) -> ScenarioSpec:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(scenario_names())}") from None


def _epoch_ns(when: datetime) -> int:
    return int(when.timestamp()) * 10**9


def _jitter(key: str, low: int, high: int) -> int:
    """A deterministic pseudo-random integer in ``[low, high]``."""
    return low + zlib.crc32(key.encode()) % (high - low + 1)


def _plans(spec: ScenarioSpec, faulty: bool) -> list[StepPlan]:
    plans = [StepPlan(BASE_STEP + i, p2p_mode_for(BASE_STEP + i)) for i in range(WINDOW_STEPS)]
    if faulty and spec.faults:
        last = plans[-1]
        mutations = {(rank, f.tag): f.mutation for f in spec.faults if f.mutation is not None
                     for rank in f.ranks}
        plans[-1] = StepPlan(last.step, spec.fault_step_p2p, mutations=mutations)
    return plans


def _programs(topology: Topology, spec: ScenarioSpec, *, with_faults: bool) -> dict[int, list[ProgramItem]]:
    plans = _plans(spec, with_faults)
    programs: dict[int, list[ProgramItem]] = {}
    hangs = {rank: f for f in spec.faults if f.kind is not FaultKind.MISMATCH for rank in f.ranks}
    for rank in range(topology.layout.world_size):
        items: list[ProgramItem] = []
        for plan in plans[:-1]:
            items += build_step(topology, rank, plan)
        last = build_step(topology, rank, plans[-1])
        fault = hangs.get(rank) if with_faults else None
        if fault is not None:
            last = _insert_hang(last, fault, rank)
        programs[rank] = items + last
    return programs


def _insert_hang(items: list[ProgramItem], fault: Fault, rank: int) -> list[ProgramItem]:
    for index, item in enumerate(items):
        if getattr(item, "tag", None) == fault.tag:
            return items[:index] + [Hang(f"{fault.kind.value} before {fault.tag}")] + items[index:]
    tags = sorted({t for i in items if (t := getattr(i, "tag", ""))})
    raise ValueError(f"rank {rank} has no call tagged {fault.tag!r} in the fault step; tags: {tags}")


def _fast_forward(topology: Topology, steps: int) -> dict[int, RankCounters]:
    """Counters after ``steps`` healthy steps plus the start-up barrier on the default group."""
    per_mode = {}
    for mode in P2PMode:
        one_step = {r: build_step(topology, r, StepPlan(0, mode)) for r in range(topology.layout.world_size)}
        per_mode[mode] = count_step(topology, one_step)
    n_batched, n_plain = (steps + 1) // 2, steps // 2  # p2p_mode_for: even steps are batched
    result: dict[int, RankCounters] = {}
    for rank in range(topology.layout.world_size):
        b, p = per_mode[P2PMode.BATCHED][rank], per_mode[P2PMode.PLAIN][rank]
        counters = RankCounters(record_id=1 + n_batched * b.record_id + n_plain * p.record_id)
        default = counters.group("0")
        default.coll = default.op = default.last_work_seq = 1  # "nccl:all_reduce_barrier"
        for info in topology.groups_of(rank):
            if info.kind is GroupKind.DEFAULT:
                continue
            g = counters.group(info.name)
            gb, gp = b.group(info.name), p.group(info.name)
            g.coll = n_batched * gb.coll + n_plain * gp.coll
            g.p2p = n_batched * gb.p2p + n_plain * gp.p2p
            g.op = n_batched * gb.op + n_plain * gp.op
            g.last_work_seq = g.p2p if info.kind is GroupKind.PP else g.coll
        result[rank] = counters
    return result


def _simulate(topology: Topology, programs: dict[int, list[ProgramItem]], base_step: int) -> Simulation:
    starts = {r: _jitter(f"start/{r}", 0, 3 * _MS) for r in programs}
    sim = Simulation(topology, programs, _fast_forward(topology, base_step), starts)
    sim.run()
    return sim


def _dump_times(sim: Simulation, spec: ScenarioSpec) -> dict[int, int]:
    """Simulation time at which each rank dumps (every rank here; the caller drops dead ones)."""
    ranks = list(sim.programs)
    if spec.trigger is DumpTrigger.QUIESCENT:
        at = sim.end_ns() + 2_000 * _MS  # on demand, while the checkpoint is being written
        return {r: at + _jitter(f"dump/{r}", 0, 900 * _MS) for r in ranks}
    if spec.trigger is DumpTrigger.MID_STEP:
        last_step = BASE_STEP + WINDOW_STEPS - 1
        begin = min(rec.created_ns for r in ranks for rec in sim.records[r] if rec.step == last_step)
        at = begin + (sim.end_ns() - begin) * 45 // 100
        return {r: at + _jitter(f"dump/{r}", 0, 300 * _MS) for r in ranks}
    stuck = [w for r in ranks for w in sim.incomplete(r)]
    if not stuck:
        raise RuntimeError(f"scenario {spec.name!r} should hang, but every op completed")
    first = min(stuck, key=lambda w: (w.created_ns, w.rank))
    timeout_at = first.created_ns + 600_000 * _MS
    # The timed-out rank dumps at once and signals the rest, whose monitors poll about every second.
    return {r: timeout_at + (5 * _MS if r == first.rank else _jitter(f"dump/{r}", 150 * _MS, 1_500 * _MS))
            for r in ranks}


def _stale_dumps(topology: Topology, spec: ScenarioSpec, sim: Simulation, ranks: set[int]
                 ) -> tuple[dict[int, dict[str, Any]], dict[int, int]]:
    """Dumps of ``ranks`` taken on demand about an hour before the incident."""
    period = _step_period(sim)
    steps_back = round(STALE_AGE_NS / period)
    old_sim = _simulate(topology, _programs(topology, spec, with_faults=False), BASE_STEP - steps_back)
    epoch = _epoch_ns(WINDOW_START) - steps_back * period
    settings = DumpSettings(epoch_ns=epoch, timing=spec.timing, ring_size=spec.ring_size)
    at = old_sim.end_ns() + 1_500 * _MS
    dumps = {r: rank_dump(old_sim, r, at, settings) for r in sorted(ranks)}
    return dumps, {r: epoch + at for r in dumps}


def _step_period(sim: Simulation) -> int:
    """Wall time of one healthy step: between the first enqueues of the first two steps."""
    firsts = [min(rec.created_ns for r in sim.programs for rec in sim.records[r] if rec.step == step)
              for step in (BASE_STEP, BASE_STEP + 1)]
    return firsts[1] - firsts[0]


def _manifest(spec: ScenarioSpec, topology: Topology, dump_ns: dict[int, int]) -> JobManifest:
    layout = topology.layout
    ranks = {}
    for rank in range(layout.world_size):
        host, local = layout.host_of(rank), layout.local_rank(rank)
        when = dump_ns.get(rank)
        ranks[rank] = RankIdentity(
            host=host, local_rank=local, gpu_index=local,
            pid=281_400 + 13 * local + (rank // layout.ranks_per_host) % 5,
            gpu_pci_bus_id=_BUS_IDS[local % len(_BUS_IDS)],
            gpu_uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{host}/{local}")),
            dumped_at=datetime.fromtimestamp(when / 1e9, UTC) if when is not None else None,
        )
    groups = {name: ProcessGroupSpec(desc=info.desc, ranks=info.ranks)
              for name, info in topology.groups.items()}
    return JobManifest(job_id=f"gpt3d-64x-{spec.name}", world_size=layout.world_size, ranks=ranks,
                       process_groups=groups)


if __name__ == "__main__":
    sys.exit(main())
