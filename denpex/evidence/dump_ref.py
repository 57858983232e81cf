"""One dump to read: which store it is in, its name there, and whose it is.

Its own module, below discovery (which makes them) and the readers (which take them), so that a
reader such as ``stacks.fr_callsite`` can name the type without importing discovery.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["DumpRef"]


@dataclass(frozen=True, slots=True)
class DumpRef:
    """One dump to read: where it is and whose it is. Small and picklable for worker processes."""

    store_uri: str
    name: str
    rank: int
    size: int
    modified: datetime | None = None
    version: str | None = None
    """The store's token for this write of the object (see ``StoredObject.version``)."""
