"""What every Denpex task and flow is decorated with: no result cache, no persisted result.

Prefect's default cache policy looks each task up by a key (its inputs, its source, the run id)
in the result storage, and reads a hit with its pickle serializer. The key is known to whoever
created the run, and the storage is chosen through the API (a run's ``PREFECT_DEFAULT_RESULT_
STORAGE_BLOCK``, or the server's default storage), so a planted pickle would run code in the flow
process (attacker review). Nothing in Denpex needs a result read back: a retry runs the task
again, a pause waits in process, and every outcome is written to the state directory.
"""

from typing import Any

from prefect.cache_policies import NO_CACHE

__all__ = ["NOT_CACHED", "NOT_PERSISTED"]

NOT_CACHED: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}
"""Keyword arguments for ``@task``."""

NOT_PERSISTED: dict[str, Any] = {"persist_result": False}
"""Keyword arguments for ``@flow``."""
