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

from denpex.evidence.loading import validation_problems
from denpex.evidence.stacks.model import (
    MAX_BYTES,
    MAX_FRAMES,
    MAX_NOTES,
    MAX_TEXT,
    MAX_THREADS,
    RankStacks,
    StackError,
    clean_text,
)

__all__ = ["CONTROL_NOTE", "LONG_STRINGS_NOTE", "load_json", "trimmed", "validated"]

LONG_STRINGS_NOTE = f"strings over {MAX_TEXT} characters were cut"
CONTROL_NOTE = "control characters in strings became spaces"


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
    cleaner = _Cleaner()
    out: dict[str, Any] = {k: cleaner(v) if k == "detail" else v for k, v in raw.items()}
    own_notes = out.get("notes")
    if isinstance(own_notes, list):
        out["notes"] = [cleaner(n) for n in own_notes]
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
            if not isinstance(thread, dict):
                kept.append(thread)  # the model refuses it
                continue
            frames = thread.get("frames")
            if isinstance(frames, list) and len(frames) > MAX_FRAMES:
                thread = {**thread, "frames": frames[:MAX_FRAMES],
                          "frames_dropped": len(frames) - MAX_FRAMES}
                frames = thread["frames"]
                cut_threads += 1
            thread = {**thread, "name": cleaner(thread.get("name"))} if "name" in thread else dict(thread)
            if isinstance(frames, list):
                thread["frames"] = [{**f, "file": cleaner(f.get("file")), "function": cleaner(f.get("function"))}
                                    if isinstance(f, dict) else f for f in frames]
            kept.append(thread)
        if cut_threads:
            notes.append(f"{cut_threads} thread(s) had over {MAX_FRAMES} frames: kept the innermost "
                         f"{MAX_FRAMES} of each")
        out["threads"] = kept
    notes += cleaner.notes()
    return out, notes


class _Cleaner:
    """Cleans strings (leaving other values to the model's types) and remembers what it changed."""

    def __init__(self) -> None:
        self.cut = self.flattened = False

    def __call__(self, value: object) -> object:
        if not isinstance(value, str) or (len(value) <= MAX_TEXT and value.isprintable()):
            return value
        cleaned = clean_text(value)
        self.cut = self.cut or len(clean_text(value, limit=len(value))) > MAX_TEXT
        self.flattened = self.flattened or not value.isprintable()
        return cleaned

    def notes(self) -> list[str]:
        return ([LONG_STRINGS_NOTE] if self.cut else []) + ([CONTROL_NOTE] if self.flattened else [])


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
        problems = clean_text(validation_problems(exc, first=3), limit=400)
        more = f" (and {exc.error_count() - 3} more)" if exc.error_count() > 3 else ""
        raise StackError(f"{what} is not a valid stacks record: {problems}{more}") from exc
