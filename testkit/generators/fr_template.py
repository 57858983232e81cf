"""The real dump the synthetic expansion copies its shape from.

``benchmarks/make_template.py`` records it: four Gloo processes, more than 2,000 collectives, rank
0's ring dumped with ``_dump_fr_trace(includeCollectives=True, includeStackTraces=True,
onlyActive=False)`` and stored gzip-compressed in ``benchmarks/templates/``.

Only the shape is taken: one stack per op kind (the frame dicts stay shared objects, as torch
shares them, so that the memo layout of the written pickles matches torch's), the dtype, the
thread name and id and the timeout. Everything that varies across ranks is set by the expansion.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from denpex.evidence.errors import DumpError
from denpex.evidence.safe_pickle import safe_loads
from testkit.generators.hang_model import ExpansionError

__all__ = ["DumpTemplate", "load_template", "template_from_dump", "STACKS"]

STACKS = ("all_reduce", "world_all_reduce", "reduce_scatter", "all_gather", "send", "recv")
"""The stacks a template provides, by op."""

# torch 2.13 distributed_c10d.py: the lines where isend/irecv call into the backend and where
# send/recv call them. Gloo records no p2p, so the real template has no p2p stack to copy.
_P2P_FRAMES = {
    "send": (("isend", 2652), ("send", 2751)),
    "recv": (("irecv", 2709), ("recv", 2796)),
}


@dataclass(frozen=True)
class DumpTemplate:
    """What the expansion copies from a real dump."""

    thread_name: str
    thread_id: str
    timeout_ms: int
    dtype: str
    frames: Mapping[str, list[dict[str, Any]]]
    """A stack per name in ``STACKS``."""


def load_template(path: Path) -> DumpTemplate:
    """Read a real pickled FR dump (optionally gzip-compressed) with the safe unpickler."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ExpansionError(f"{path}: cannot read the template: {exc.strerror or exc}") from exc
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    try:
        raw = safe_loads(data)
    except DumpError as exc:
        raise ExpansionError(f"{path}: template is not a usable dump: {exc}") from exc
    if not isinstance(raw, dict):
        raise ExpansionError(f"{path}: template top level is {type(raw).__name__}, not a dict")
    return template_from_dump(raw, source=str(path))


def template_from_dump(raw: Mapping[str, Any], *, source: str = "template") -> DumpTemplate:
    """Pick one stack per op kind out of a real dump's entries.

    The dump must hold a subgroup and a world ``all_reduce``, a reduce-scatter and an all-gather,
    with stacks, as ``benchmarks/make_template.py`` records them.
    """
    entries = raw.get("entries")
    if not isinstance(entries, list) or not entries:
        raise ExpansionError(f"{source}: template has no entries; dump with includeCollectives")
    found: dict[str, dict[str, Any]] = {}
    for entry in entries:
        frames = entry.get("frames") or []
        top = frames[0].get("name", "") if frames else ""
        name = str(entry.get("profiling_name", ""))
        if top.startswith("reduce_scatter"):
            found.setdefault("reduce_scatter", entry)
        elif name.endswith("all_gather"):
            found.setdefault("all_gather", entry)
        elif name.endswith("all_reduce") and top == "all_reduce":
            world = entry.get("process_group", ("", ""))[1] == "default_pg"
            found.setdefault("world_all_reduce" if world else "all_reduce", entry)
    wanted = ("all_reduce", "world_all_reduce", "reduce_scatter", "all_gather")
    lacking = [k for k in wanted if k not in found]
    if lacking:
        raise ExpansionError(
            f"{source}: template lacks entries with stacks for {lacking}; record it with "
            "benchmarks/make_template.py, which runs every op the expansion needs"
        )
    frames = {k: list(found[k]["frames"]) for k in wanted}
    base = frames["all_reduce"]
    filename = base[0]["filename"]
    for op, stack in _P2P_FRAMES.items():
        # New frames are created once and shared by every p2p entry, as torch shares frames.
        frames[op] = [{"name": n, "filename": filename, "line": line} for n, line in stack]
        frames[op] += base[1:]
    sample = found["all_reduce"]
    dtypes = sample.get("input_dtypes") or ["Float"]
    return DumpTemplate(
        thread_name=str(sample.get("thread_name", "")),
        thread_id=str(sample.get("thread_id", "")),
        timeout_ms=int(sample.get("timeout_ms", 600000)),
        dtype=str(dtypes[0]),
        frames=frames,
    )
