"""Read the next dump while this one is decoded, where the store's reads wait.

Over S3 each read waits on the network and on the store's server; decoding holds the GIL but a
socket read does not, so one read in flight hides most of that wait (512 ranks from moto: 19 s ->
12.7 s on 2 busy cores). Only one dump ahead is held, so peak memory grows by one raw dump.

Such a read runs on a thread of its own, joined before its bytes are used: a thread that died in a
way nobody could report (out of memory while handing its result over) cannot leave the batch
waiting forever; its dump is simply read again here. So is a read that raced a decode's memory cap
(``memory_budget``): the cap is process-wide while a decode holds it, and the re-read runs
outside it. ``EvidenceStore.read`` must therefore be safe to call from two threads at once
(boto3 clients and plain file reads are).

A store whose reads do not wait (``EvidenceStore.reads_wait`` false: a folder on a local disk) is read inline,
each dump when its turn comes: on 128 real-size dumps from disk a reader thread per dump cost the
batch about 4 ms of CPU per dump (about half the decode's own), and hid a read of well under one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from denpex.evidence.dump_ref import DumpRef
from denpex.evidence.errors import DumpError
from denpex.evidence.store import EvidenceStore

__all__ = ["read_ahead"]


def read_ahead(work: Sequence[tuple[DumpRef, EvidenceStore]],
               max_bytes: int) -> Iterator[tuple[DumpRef, bytes | DumpError]]:
    """Each dump's bytes (or why they could not be read), in order: one read ahead where the
    store's reads wait, else each read when its dump's turn comes."""
    if not work:
        return
    pending = _Read(*work[0], max_bytes)
    for index, (ref, _source) in enumerate(work):
        current = pending
        if index + 1 < len(work):
            pending = _Read(*work[index + 1], max_bytes)
        # Not bound to a local: the consumer's ``del`` of the bytes then frees them.
        yield ref, current.take()


class _Read:
    """One dump's read: on its own thread where the store's reads wait, else inline when taken."""

    def __init__(self, ref: DumpRef, source: EvidenceStore, max_bytes: int) -> None:
        self._ref, self._source, self._max_bytes = ref, source, max_bytes
        self._got: bytes | DumpError | MemoryError | None = None
        self._thread: threading.Thread | None = None
        if source.reads_wait:
            self._thread = threading.Thread(target=self._run, name=f"denpex-read-{ref.rank}", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._got = self._source.read(self._ref.name, max_bytes=self._max_bytes)
        except (DumpError, MemoryError) as exc:
            self._got = exc

    def take(self) -> bytes | DumpError:
        if self._thread is None:
            self._run()  # inline, now that its turn has come
        else:
            self._thread.join()
        got, self._got = self._got, None
        if got is None or isinstance(got, MemoryError):
            # Its thread died unreported (an unexpected error is raised again here) or the read
            # raced a decode's memory cap (or, inline, ran out of memory): read again, outside any cap.
            try:
                return self._source.read(self._ref.name, max_bytes=self._max_bytes)
            except MemoryError:
                return DumpError("out of memory while reading")
        return got
