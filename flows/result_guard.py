"""No Denpex flow run reads a stored result.

Denpex persists no result (``tasks/options.py``), so a result record that a run would read from
storage can only come from outside: whoever reaches the Prefect API can force a flow run's (or a
task run's) state to Completed with result metadata that names a storage location and a
serializer, and the engine then fetches and deserializes that record in the flow process (attacker
review: a forged Completed state, set while the run was pending, ran ``os.system`` as the
worker's user through a pickled record). Reading a record from metadata is refused, for the whole
process, as soon as any flow module is imported: the run then fails with the reason instead.
"""

from __future__ import annotations

from typing import Any, NoReturn

from prefect.results import ResultStore

__all__ = ["StoredResultRefused", "refuse_stored_results"]


class StoredResultRefused(RuntimeError):
    """A stored result record was about to be read (and deserialized) in a Denpex process."""


def _refused(key: object) -> StoredResultRefused:
    return StoredResultRefused(
        f"a state handed this run a stored result ({key!r}); Denpex persists no result, so it came from "
        "outside (a state forced through the Prefect API) and is not read")


async def _from_metadata(cls: type[ResultStore], metadata: Any) -> NoReturn:
    raise _refused(getattr(metadata, "storage_key", None))


def _read(self: ResultStore, key: str, holder: str | None = None) -> NoReturn:
    raise _refused(key)


async def _aread(self: ResultStore, key: str, holder: str | None = None) -> NoReturn:
    raise _refused(key)


def refuse_stored_results() -> None:
    """Make Prefect's ways to a stored record raise: from a state's metadata (async; the sync path
    for a failed state's exception goes through ``read``) and by key (idempotent)."""
    ResultStore._from_metadata = classmethod(_from_metadata)  # type: ignore[method-assign,assignment]
    ResultStore.read = _read  # type: ignore[method-assign]
    ResultStore.aread = _aread  # type: ignore[method-assign]
