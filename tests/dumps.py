"""A tiny builder of Flight Recorder dumps for unit tests (real dumps come from the generators)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

T0 = 1_764_441_902_000_000_000  # 2025-11-29T18:45:02Z in ns


def entry(pg: str, seq: int, *, retired: bool = True, op: str = "gloo:all_reduce", record_id: int = 0,
          sizes: list[list[int]] | None = None, dtype: str = "Float", desc: str | None = None,
          state: str = "scheduled", t: int | None = None, timeout_ms: int = 5000,
          p2p_seq_id: int = 0, is_p2p: bool = False) -> dict[str, Any]:
    sizes = sizes if sizes is not None else [[4]]
    return {
        "record_id": record_id, "pg_id": 0,
        "process_group": (pg, desc or ("default_pg" if pg == "0" else "undefined")),
        "collective_seq_id": seq, "p2p_seq_id": p2p_seq_id, "op_id": seq, "profiling_name": op,
        "input_sizes": sizes, "input_dtypes": [dtype] * len(sizes),
        "output_sizes": sizes, "output_dtypes": [dtype] * len(sizes),
        "state": state, "time_created_ns": t if t is not None else T0 + seq * 1_000_000,
        "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
        "retired": retired, "timeout_ms": timeout_ms, "is_p2p": is_p2p,
    }


def history(pg: str, done: int, *, pending: int = 0, start_record: int = 0, **kw: Any) -> list[dict[str, Any]]:
    """``done`` retired collectives in ``pg`` then ``pending`` unretired ones."""
    out = [entry(pg, s, record_id=start_record + s - 1, **kw) for s in range(1, done + 1)]
    out += [entry(pg, s, retired=False, record_id=start_record + s - 1, **kw)
            for s in range(done + 1, done + pending + 1)]
    return out


def dump(entries: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A dump of ``entries``. No ``pg_config`` unless given: Gloo's ``"[]"`` would say that the
    rank built a subgroup, and an NCCL one names the rank's own groups (both are evidence)."""
    body: dict[str, Any] = {"version": "2.10", "pg_status": {}, "entries": entries}
    body.update(extra)
    return body


def write(folder: Path, dumps: dict[int, dict[str, Any]], *, fmt: str = "pickle",
          manifest: dict[str, Any] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank, body in dumps.items():
        if fmt == "pickle":
            (folder / f"rank_{rank}.pkl").write_bytes(pickle.dumps(body, protocol=2))
        else:
            (folder / f"rank_{rank}.json").write_text(json.dumps(body))
    if manifest is not None:
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder
