"""Turning untrusted bytes into a :class:`RankStacks`: size first, then JSON, then trim, then validate.

Every JSON reader comes through here, so every source is held to the same limits: a file over
:data:`MAX_BYTES` is refused before it is decoded, one nested past the decoder's recursion limit
is refused, and deep nesting within that fails the model's types; more threads or frames than the
model holds are trimmed (the innermost frames and the main thread are kept) with a note; strings
are cut and flattened by the model; wrong types are refused with the fields named.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from denpex.evidence.stacks.model import MAX_BYTES, MAX_FRAMES, MAX_NOTES, MAX_TEXT, MAX_THREADS, RankStacks, StackError

__all__ = ["load_json", "trimmed", "validated"]

# The deepest a stacks file nests (object > threads > thread > frames > frame) is 5; the scan
# for long strings never walks further than this.
_MAX_DEPTH = 8


def load_json(data: bytes, *, what: str, limit: int = MAX_BYTES) -> Any:
    """Decode ``data`` as JSON after checking its size."""
    if len(data) > limit:
        raise StackError(f"{what} is {len(data):,} bytes, over the limit of {limit:,}: refused")
    if not data.strip():
        raise StackError(f"{what} is empty: the file was cut short or never written")
    try:
        return json.loads(data.decode("utf-8"))  # decoded here: json.loads(bytes) would guess UTF-16
    except UnicodeDecodeError as exc:
        raise StackError(f"{what} is not UTF-8 JSON") from exc
    except RecursionError as exc:
        raise StackError(f"{what} nests too deeply for a stacks file: refused") from exc
    except ValueError as exc:  # JSONDecodeError, and numbers with too many digits
        raise StackError(f"{what} is not valid JSON ({str(exc)[:80]})") from exc


def trimmed(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``raw`` (collector-shaped) with threads and frames cut to the model's bounds, and what was cut.

    Threads beyond :data:`MAX_THREADS` are dropped, the main thread kept first in line; frames
    beyond :data:`MAX_FRAMES` are dropped from the outermost end, since the innermost ones say
    where the thread is. Types are left for the model to check.
    """
    out = dict(raw)
    notes: list[str] = []
    threads = raw.get("threads")
    if isinstance(threads, list):
        if len(threads) > MAX_THREADS:
            main = [t for t in threads if isinstance(t, dict) and t.get("name") == "MainThread"][:1]
            rest = [t for t in threads if not (main and t is main[0])]
            threads = main + rest[: MAX_THREADS - len(main)]
            notes.append(f"{len(raw['threads']):,} threads, over the limit of {MAX_THREADS}: kept "
                         f"{MAX_THREADS} (the main thread first)")
            out["threads_dropped"] = len(raw["threads"]) - MAX_THREADS
        kept = []
        cut_threads = 0
        for thread in threads:
            frames = thread.get("frames") if isinstance(thread, dict) else None
            if isinstance(frames, list) and len(frames) > MAX_FRAMES:
                thread = {**thread, "frames": frames[:MAX_FRAMES],
                          "frames_dropped": len(frames) - MAX_FRAMES}
                cut_threads += 1
            kept.append(thread)
        if cut_threads:
            notes.append(f"{cut_threads} thread(s) had over {MAX_FRAMES} frames: kept the innermost "
                         f"{MAX_FRAMES} of each")
        out["threads"] = kept
    if _has_long_string(out):
        notes.append(f"strings over {MAX_TEXT} characters were cut")
    return out, notes


def _has_long_string(value: object, depth: int = 0) -> bool:
    if isinstance(value, str):
        return len(value) > MAX_TEXT
    if depth > _MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return any(_has_long_string(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return any(_has_long_string(v, depth + 1) for v in value)
    return False


def validated(raw: object, *, what: str, notes: list[str] | None = None) -> RankStacks:
    """A :class:`RankStacks` from a collector-shaped mapping, trimmed; wrong types are a StackError."""
    if not isinstance(raw, dict):
        raise StackError(f"{what} holds a {type(raw).__name__}, not the object a stacks file holds")
    shaped, trims = trimmed(raw)
    own = shaped.get("notes", [])
    if isinstance(own, list):  # anything else is left for the model to refuse
        shaped["notes"] = [*(notes or []), *trims, *own][:MAX_NOTES]
    try:
        return RankStacks.model_validate(shaped)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:3])
        more = f" (and {exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
        raise StackError(f"{what} is not a valid stacks record: {problems}{more}") from exc
