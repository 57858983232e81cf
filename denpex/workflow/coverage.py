"""Evidence coverage: which ranks have a dump in the store yet, and waiting for the rest.

The alert usually arrives before the last ranks have uploaded. The flow polls the store until
ranks 0..world_size-1 are all in or the runbook's grace period ends, then triages what is there::

    world_size 4, dumps for ranks 0, 1, 3  ->  Coverage(present=[0, 1, 3], missing=[2], complete=False)

A world size inferred from file names (no manifest, none given) is never "complete": a rank
above the largest number seen cannot be seen missing, so the wait runs the whole grace period.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

from pydantic import BaseModel, ConfigDict

from denpex.analysis.triage import EvidenceInventory

__all__ = ["Coverage", "coverage_of", "wait_for_coverage"]


class Coverage(BaseModel):
    """How much of the job's evidence is in."""

    model_config = ConfigDict(frozen=True)

    world_size: int
    present: list[int]
    missing: list[int]
    world_size_known: bool
    """False when the world size was inferred from file names."""

    @property
    def complete(self) -> bool:
        return self.world_size_known and self.world_size > 0 and not self.missing

    @property
    def fraction(self) -> float:
        return len(self.present) / self.world_size if self.world_size else 0.0


def coverage_of(inventory: EvidenceInventory) -> Coverage:
    """The coverage one inventory shows."""
    present = sorted(inventory.dumps)
    return Coverage(
        world_size=inventory.world_size, present=present,
        missing=[r for r in range(inventory.world_size) if r not in inventory.dumps],
        world_size_known=inventory.size_note is None,
    )


def wait_for_coverage(
    read: Callable[[], EvidenceInventory],
    *,
    grace: timedelta,
    poll: timedelta,
    on_change: Callable[[Coverage], None] = lambda coverage: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> EvidenceInventory:
    """Read the store until every rank is in or ``grace`` has passed; return the last inventory.

    ``on_change`` sees each coverage that differs from the one before (a progress display).
    The grace period counts from the first read, so a slow store cannot stretch it.
    """
    deadline = clock() + grace.total_seconds()
    inventory = read()
    shown = coverage_of(inventory)
    on_change(shown)
    while not shown.complete and clock() < deadline:
        sleep(min(poll.total_seconds(), max(0.0, deadline - clock())))
        inventory = read()
        current = coverage_of(inventory)
        if current != shown:
            on_change(current)
            shown = current
    return inventory
