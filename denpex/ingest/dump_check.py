"""Check an uploaded dump with the safe loader in a worker process, before it is accepted.

The dump is checked without being built (:mod:`denpex.evidence.dump_envelope`: a JSON dump's
objects are dropped as they are parsed, so a worker holds its text and little more), under the
decode memory budget (``denpex.evidence.memory_budget``), which caps the whole process while it
holds: a hostile dump checked in the server would squeeze every other request. Worker
processes take that risk instead, each decode under a CPU budget too
(``denpex.evidence.cpu_budget``); a worker that dies or runs past its budget is replaced, failing
only the dump it held. Jobs are handed out fairly across tenants (``denpex.analysis.lanes``), so
one tenant's flood of slow dumps cannot hold up another tenant's upload.
"""

from __future__ import annotations

from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from denpex.analysis.lanes import LaneKilled, Lanes
from denpex.evidence.cpu_budget import DEFAULT_CPU_BUDGET, CpuBudget, arm_cpu_limit
from denpex.evidence.errors import DumpError
from denpex.evidence.dump_envelope import check_envelope, check_json_text, is_pickle, json_text
from denpex.evidence.fr_dump import DumpEncoding
from denpex.ingest.errors import InvalidRequestError

__all__ = ["DumpCheck", "DumpChecker", "check_dump", "encoding_of_filename"]


@dataclass(frozen=True, slots=True)
class DumpCheck:
    """What the worker learned about a dump that passed."""

    encoding: DumpEncoding
    version: str
    entries: int


def encoding_of_filename(filename: str) -> DumpEncoding:
    """``.json`` says JSON; no extension or ``.pkl`` says pickle (docs/contracts.md)."""
    return DumpEncoding.JSON if filename.lower().endswith(".json") else DumpEncoding.PICKLE


def check_dump(source: bytes | Path, filename: str) -> DumpCheck | str:
    """Check the dump (its bytes, or the file that holds them) without building it
    (:func:`denpex.evidence.dump_envelope.check_envelope`); a refusal is returned as its message
    (picklable)."""
    try:
        data = source if isinstance(source, bytes) else source.read_bytes()
    except OSError as exc:
        return f"the spooled upload could not be read ({exc.strerror or exc})"
    try:
        if is_pickle(data):
            envelope = check_envelope(data, source=filename)
        else:
            text, size = json_text(data), len(data)
            del data  # held as text from here on, not twice
            envelope = check_json_text(text, size=size)
    except DumpError as exc:
        return str(exc)
    declared = encoding_of_filename(filename)
    if envelope.encoding is not declared:
        return (f"the file name {filename!r} says {declared.value} but the bytes are {envelope.encoding.value}; "
                "send the pickle without an extension or as .pkl, the JSON as .json")
    return DumpCheck(encoding=envelope.encoding, version=f"{envelope.version[0]}.{envelope.version[1]}",
                     entries=envelope.entries)


class DumpChecker:
    """Worker processes that run :func:`check_dump`, each decode within ``cpu_budget``.

    ``workers`` decodes run at once; while other tenants wait, one tenant holds at most
    ``workers - 1`` of them.
    """

    def __init__(self, workers: int = 2, *, cpu_budget: CpuBudget = DEFAULT_CPU_BUDGET) -> None:
        self._budget = cpu_budget
        self._lanes = Lanes(workers, initializer=arm_cpu_limit, initargs=(cpu_budget,))

    def check(self, source: bytes | Path, filename: str, *, tenant: str | None = None) -> DumpCheck:
        """The dump's facts, or InvalidRequestError (422) saying why it was refused.

        With a ``Path`` the worker reads the file itself, so the server never holds the dump.
        """
        size = len(source) if isinstance(source, bytes) else _size_of(source)
        allowance = self._budget.seconds_for(size)
        future = self._lanes.submit(check_dump, source, filename, key=tenant or "", cpu_s=allowance)
        try:
            outcome = future.result()
        except LaneKilled as exc:
            raise InvalidRequestError(
                f"the dump {filename!r} took more than {exc.allowance_s:.1f} s of CPU to decode (hostile "
                "or pathological); refused, nothing stored") from exc
        except BrokenProcessPool as exc:
            raise InvalidRequestError("the dump killed the worker that decoded it (hostile or corrupt); "
                                      "it was refused and nothing was stored") from exc
        if isinstance(outcome, str):
            raise InvalidRequestError(f"the dump {filename!r} was refused: {outcome}; nothing stored")
        return outcome

    def warm(self) -> None:
        """Start the workers now, so that the first upload does not wait for them."""
        self._lanes.warm()

    def close(self) -> None:
        """Stop the workers."""
        self._lanes.close()


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the worker reports the unreadable file
