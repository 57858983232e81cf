"""Check an uploaded dump with the safe loader in a worker process, before it is accepted.

The decode memory budget (``denpex.evidence.memory_budget``) caps the whole process while it
holds, so a hostile dump decoded in the server would squeeze every other request. A pool of
worker processes takes that risk instead; a worker that dies is replaced by a fresh pool.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from threading import Lock

from denpex.evidence.errors import DumpError
from denpex.evidence.fr_dump import DumpEncoding, decode_dump
from denpex.ingest.errors import InvalidRequestError

__all__ = ["DumpCheck", "DumpChecker", "check_dump", "encoding_of_filename"]


@dataclass(frozen=True, slots=True)
class DumpCheck:
    """What the worker learned about a dump that passed."""

    encoding: DumpEncoding
    version: str
    entries: int


def encoding_of_filename(filename: str) -> DumpEncoding:
    """``.json`` says JSON; no extension or ``.pkl`` says pickle (ARCHITECTURE.md)."""
    return DumpEncoding.JSON if filename.lower().endswith(".json") else DumpEncoding.PICKLE


def check_dump(data: bytes, filename: str) -> DumpCheck | str:
    """Decode ``data`` with the safe loader; a refusal is returned as its message (picklable)."""
    try:
        decoded = decode_dump(data, source=filename)
    except DumpError as exc:
        return str(exc)
    declared = encoding_of_filename(filename)
    if decoded.encoding is not declared:
        return (f"the file name {filename!r} says {declared.value} but the bytes are {decoded.encoding.value}; "
                "send the pickle without an extension or as .pkl, the JSON as .json")
    entries = decoded.raw.get("entries", [])
    return DumpCheck(encoding=decoded.encoding, version=f"{decoded.version[0]}.{decoded.version[1]}",
                     entries=len(entries) if isinstance(entries, list) else 0)


class DumpChecker:
    """A pool of worker processes that run :func:`check_dump`."""

    def __init__(self, workers: int = 2) -> None:
        self._workers = workers
        self._lock = Lock()
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        # forkserver: workers start from a clean process, not a copy of the threaded server.
        return ProcessPoolExecutor(self._workers, mp_context=multiprocessing.get_context("forkserver"))

    def check(self, data: bytes, filename: str) -> DumpCheck:
        """The dump's facts, or InvalidRequestError (422) saying why it was refused."""
        with self._lock:
            pool = self._pool
        try:
            outcome = pool.submit(check_dump, data, filename).result()
        except BrokenProcessPool as exc:
            with self._lock:
                if self._pool is pool:
                    self._pool = self._new_pool()
            raise InvalidRequestError("the dump killed the worker that decoded it (hostile or corrupt); "
                                      "it was refused and nothing was stored") from exc
        if isinstance(outcome, str):
            raise InvalidRequestError(f"the dump {filename!r} was refused: {outcome}")
        return outcome

    def close(self) -> None:
        """Stop the workers."""
        self._pool.shutdown(wait=True, cancel_futures=True)
