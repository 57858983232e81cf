"""Expand one real Gloo ring into an N-rank, Gloo-style dump set: the world group and tp pairs.

What production Gloo jobs write, at any size (``notes/flight-recorder.md``, torch 2.13):

- every entry is ``scheduled``; only ``retired`` tells a finished op from one in flight, and the
  ``time_discovered_*`` are empty; Gloo records no point-to-point entries;
- ``pg_config`` is Gloo's one unnamed entry, ``"[]"`` on a rank that built a subgroup;
- ``pg_status`` is keyed by the rank-local pg_id (world 0, its tp pair 1).

The job: each step is an ``all_reduce`` in the rank's tp pair, then one in the world group. In
the last step one rank never enters the world ``all_reduce`` (``not_entered``); every other rank
waits in it. A share of the ranks (the even member of every fifth pair) show Gloo's retire race
on their pair's newest op: it reads ``retired=False`` while their partner retired it, and the
manifest's dump times say it completed (both joined it together, well inside its timeout). The
world group's every member is compared with the retire race's rule, so a step that is quadratic
in the group's size shows here (issue 29, section 6).

Speed: three rings are encoded (a waiting rank, a racing rank, the culprit) with a fixed-width
placeholder as the pair's group name; each rank's file is that ring with its pair's name put in
(``str.replace`` on the bytes: the pickle holds the name once, its process_group tuple is shared).
Pair names are zero-padded counters, so that every name has the placeholder's width.
"""

from __future__ import annotations

import json
import pickle
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from testkit.generators.fr_template import DumpTemplate

__all__ = ["GLOO_PREFIX", "GlooSet", "generate_gloo_set", "racing", "gloo_culprit"]

GLOO_PREFIX = "comm_lib_trace_rank_"
_STEP_NS = 10_000_000
# 2026-11-29T18:00:00Z, as the NCCL-style sets: reproducible files.
_T0_NS = int(datetime(2026, 11, 29, 18, 0, tzinfo=UTC).timestamp()) * 1_000_000_000
_WIDTH = 6
_PLACEHOLDER = "Z" * _WIDTH


@dataclass(frozen=True)
class GlooSet:
    """A written Gloo-style set (the fields ``benchmarks/triage_scale.py`` reports)."""

    path: Path
    world_size: int
    files: int
    bytes_written: int
    seconds: float
    states: dict[str, int]


def racing(rank: int) -> bool:
    """The ranks that show the retire race on their pair's newest op."""
    return rank % 2 == 0 and (rank // 2) % 5 == 1


def gloo_culprit(world_size: int) -> int:
    """The rank that never enters the last world all_reduce (odd, its partner not racing)."""
    pair = world_size // 4
    while pair % 5 == 1:
        pair += 1
    return 2 * pair + 1


def _pair_name(rank: int) -> str:
    return f"{rank // 2 + 1:0{_WIDTH}d}"


def generate_gloo_set(folder: Path, *, world_size: int, template: DumpTemplate, ring_size: int = 2000) -> GlooSet:
    """Write ``<prefix><rank>`` for every rank, ``manifest.json`` and ``expected.json``."""
    if world_size < 4 or world_size % 2 or ring_size < 4 or ring_size % 2:
        raise ValueError("world_size and ring_size must be even and at least 4")
    start = time.monotonic()
    culprit = gloo_culprit(world_size)
    steps = ring_size // 2 + 8  # the last step's number: more history than the ring holds
    last_created = _T0_NS + steps * _STEP_NS
    dumped_at = last_created + int(0.8 * template.timeout_ms * 1_000_000)
    rings = {kind: pickle.dumps(_dump(template, steps, ring_size, kind), protocol=2)
             for kind in ("waiting", "racing", "culprit")}
    needle = _PLACEHOLDER.encode()
    written = 0
    for rank in range(world_size):
        kind = "culprit" if rank == culprit else "racing" if racing(rank) else "waiting"
        data = rings[kind].replace(needle, _pair_name(rank).encode(), 1)
        (folder / f"{GLOO_PREFIX}{rank}").write_bytes(data)
        written += len(data)
    when = datetime.fromtimestamp(dumped_at / 1e9, UTC).isoformat()
    groups: dict[str, Any] = {"0": {"desc": "default_pg", "ranks": list(range(world_size))}}
    groups |= {_pair_name(r): {"desc": "tp", "ranks": [r, r + 1]} for r in range(0, world_size, 2)}
    manifest = {"job_id": f"gloo-{world_size}", "world_size": world_size, "process_groups": groups,
                "ranks": {str(r): {"host": f"gpu-node-{r // 8 + 1:05d}", "dumped_at": when}
                          for r in range(world_size)}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    expected = {"scenario": "gloo", "verdict": "localized", "culprits": {str(culprit): "not_entered"},
                "missing_ranks": [], "fault_op": "world all_reduce (never entered)"}
    (folder / "expected.json").write_text(json.dumps(expected))
    states = {"WAITING": world_size - 1 - sum(map(racing, range(world_size))),
              "RACING": sum(map(racing, range(world_size))), "FROZEN": 1}
    return GlooSet(folder, world_size, world_size, written, time.monotonic() - start, states)


def _dump(template: DumpTemplate, steps: int, ring_size: int, kind: str) -> dict[str, Any]:
    """One rank's dump: ``ring_size`` entries ending at the last step."""
    pair = (_PLACEHOLDER, "tp")  # one shared tuple: the pickle holds the name once
    world = ("0", "default_pg")
    entries: list[dict[str, Any]] = []
    record = 0
    for step in range(1, steps + 1):
        last = step == steps
        created = _T0_NS + step * _STEP_NS
        entries.append(_entry(template, record, 1, pair, step, created, "all_reduce",
                              retired=not (last and kind == "racing")))
        record += 1
        if last and kind == "culprit":
            break
        entries.append(_entry(template, record, 0, world, step, created + 1_000_000, "world_all_reduce",
                              retired=not last))
        record += 1
    ring = entries[-ring_size:]
    world_done = steps - 1
    tp_done = steps - 1 if kind == "racing" else steps
    return {
        "version": "2.10",
        "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
        "comm_lib_version": "",
        "pg_status": {
            "0": {"last_enqueued_collective": world_done if kind == "culprit" else steps,
                  "last_started_collective": -1, "last_completed_collective": world_done},
            "1": {"last_enqueued_collective": steps, "last_started_collective": -1,
                  "last_completed_collective": tp_done},
        },
        "entries": ring,
    }


def _entry(template: DumpTemplate, record: int, pg_id: int, group: tuple[str, str], seq: int, created: int,
           stack: str, *, retired: bool) -> dict[str, Any]:
    sizes = [[16]]
    return {
        "frames": template.frames[stack], "record_id": record, "pg_id": pg_id, "process_group": group,
        "thread_name": template.thread_name, "thread_id": template.thread_id,
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": "gloo:all_reduce",
        "time_created_ns": created, "input_sizes": sizes, "input_dtypes": [template.dtype],
        "output_sizes": sizes, "output_dtypes": [template.dtype], "state": "scheduled",
        "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": retired,
        "timeout_ms": template.timeout_ms, "is_p2p": False,
    }
