"""Checks shared by the committed Gloo fixtures' tests and the live generator test.

A scenario folder holds ``rank_<r>.pkl`` and ``rank_<r>.json`` for every rank that dumped, plus
``manifest.json`` and ``expected.json`` (written by ``testkit.generators.gloo_scenarios``).
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from denpex.analysis.triage import triage_path
from denpex.evidence.manifest import JobManifest, load_manifest
from denpex.evidence.safe_pickle import safe_loads

EXTENSIONS = {"pickle": ".pkl", "json": ".json"}
NAMINGS = ("as_written", "renamed")
# Renamed files list in another order than the ranks (z, y, x, w), and JSON loses its extension.
_RENAMED = {"pickle": "{letter}-dump-{rank}.pkl", "json": "{letter}_something_{rank}"}
_LETTERS = "zyxw"


def scenario_names(root: Path) -> list[str]:
    return sorted(p.parent.name for p in root.glob("*/expected.json"))


def read_expected(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "expected.json").read_text())


def load_dump(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    dump = safe_loads(data) if path.suffix == ".pkl" else json.loads(data)
    assert isinstance(dump, dict), f"{path}: not a dict"
    return dump


def evidence_folder(scenario: Path, dest: Path, fmt: str, naming: str) -> Path:
    """Copy one encoding of the scenario's dumps (and its manifest) into ``dest``."""
    dest.mkdir(parents=True)
    shutil.copyfile(scenario / "manifest.json", dest / "manifest.json")
    for src in sorted(scenario.glob(f"rank_*{EXTENSIONS[fmt]}")):
        rank = int(src.stem.removeprefix("rank_"))
        name = src.name if naming == "as_written" else _RENAMED[fmt].format(
            letter=_LETTERS[rank], rank=rank)
        shutil.copyfile(src, dest / name)
    return dest


def triage_outcome(folder: Path) -> tuple[str, dict[str, str]]:
    result = triage_path(folder)
    return result.verdict.value, {str(c.rank): c.kind.value for c in result.candidates}


def check_dump_facts(folder: Path, pg_config_ranks: str = "[]") -> None:
    """The dumps say what the notes (shared/notes/flight-recorder.md) and the scenario promise.

    ``pg_config_ranks``: what Gloo writes as the one ``pg_config`` entry's ``ranks``: ``"[]"`` on
    torch 2.9 and 2.13, ``"[0, 1]"`` on 2.14 (the positions within the last pair subgroup a rank
    built)."""
    expected = read_expected(folder)
    manifest = load_manifest(folder / "manifest.json")
    dumped = {int(r) for r in expected["dump_triggers"]}
    assert {int(p.stem.removeprefix("rank_")) for p in folder.glob("rank_*.pkl")} == dumped
    assert {int(p.stem.removeprefix("rank_")) for p in folder.glob("rank_*.json")} == dumped
    pg_ids: dict[int, dict[str, int]] = {}
    for rank in sorted(dumped):
        pickled = load_dump(folder / f"rank_{rank}.pkl")
        as_json = load_dump(folder / f"rank_{rank}.json")
        _check_encodings(pickled, as_json)
        _check_gloo_quirks(pickled, manifest, pg_config_ranks)
        pg_ids[rank] = {e["process_group"][0]: e["pg_id"] for e in pickled["entries"]}
        _check_scenario_state(rank, pickled, expected, manifest)
    # pg_id is a per-process counter: the same local id names different groups on different ranks.
    tp_ids = {pg_ids[r].get(name) for r, name in ((0, "1"), (2, "2")) if r in pg_ids}
    assert tp_ids <= {1}, f"tp groups '1' and '2' should both be local pg_id 1: {pg_ids}"


def _check_encodings(pickled: dict[str, Any], as_json: dict[str, Any]) -> None:
    assert pickled["version"] == as_json["version"] == "2.10"
    assert set(pickled) == {"version", "pg_config", "comm_lib_version", "pg_status", "entries"}
    assert as_json["nccl_comm_state"] == {} and as_json["comm_lib_version"] == ""
    identity = ("record_id", "collective_seq_id", "profiling_name", "input_sizes", "output_sizes")
    assert [[e[k] for k in identity] for e in pickled["entries"]] == \
           [[e[k] for k in identity] for e in as_json["entries"]]
    for p, j in zip(pickled["entries"], as_json["entries"], strict=True):
        assert isinstance(p["process_group"], tuple) and isinstance(j["process_group"], list)
        assert p["frames"] and "frames" not in j
        assert p["time_discovered_started_ns"] is None and j["time_discovered_started_ns"] == 0
    assert all(isinstance(v, str) for s in as_json["pg_status"].values() for v in s.values())


def _check_gloo_quirks(dump: dict[str, Any], manifest: JobManifest, pg_config_ranks: str) -> None:
    # pg_config is recorded before Python names the group: one '' key, '[]' for a subgroup (2.14:
    # the positions within it).
    assert dump["pg_config"] == {"": {"name": "", "desc": "", "ranks": pg_config_ranks}}
    assert all(s["last_started_collective"] == -1 for s in dump["pg_status"].values())
    seqs: dict[str, list[int]] = {}
    for e in dump["entries"]:
        name, desc = e["process_group"]
        assert manifest.process_groups[name].desc == desc
        assert e["state"] == "scheduled" and e["time_discovered_completed_ns"] is None
        # Gloo records no point-to-point op at all.
        assert not e["is_p2p"] and e["profiling_name"].startswith("gloo:")
        assert e["profiling_name"] not in ("gloo:send", "gloo:recv")
        if e["profiling_name"] == "gloo:all_gather":
            assert e["output_sizes"] == [[manifest.world_size, *e["input_sizes"][0]]]
        seqs.setdefault(name, []).append(e["collective_seq_id"])
    for name, ids in seqs.items():
        assert ids == list(range(ids[0], ids[0] + len(ids))), f"group {name}: {ids} not contiguous"


def _check_scenario_state(rank: int, dump: dict[str, Any], expected: dict[str, Any],
                          manifest: JobManifest) -> None:
    wait = expected["waiting"].get(str(rank))
    trigger = expected["dump_triggers"][str(rank)]
    newest = {e["process_group"][0]: e for e in dump["entries"]}
    # Taken while the rank still blocked (not after its collective raised): exact state.
    blocked_when_dumped = trigger in ("stall", "request") and not expected["long_stall"]
    if wait is not None:
        entry = newest[wait["process_group"]]
        assert (entry["collective_seq_id"], entry["profiling_name"]) == \
               (wait["collective_seq_id"], wait["op"]), f"rank {rank} should wait in {wait}"
        if blocked_when_dumped:
            assert not entry["retired"], f"rank {rank} dumped while blocked in {wait}"
            status = dump["pg_status"][str(entry["pg_id"])]
            assert status["last_completed_collective"] == wait["collective_seq_id"] - 1
        if expected["long_stall"]:
            dumped_at = manifest.ranks[rank].dumped_at
            assert dumped_at is not None
            stalled_s = (dumped_at - datetime.fromtimestamp(entry["time_created_ns"] / 1e9,
                                                            dumped_at.tzinfo)).total_seconds()
            assert stalled_s > expected["timeout_s"] + 30, f"rank {rank} stalled only {stalled_s:.1f}s"
    elif blocked_when_dumped:
        assert all(e["retired"] for e in dump["entries"]), f"idle rank {rank} shows an op in flight"
