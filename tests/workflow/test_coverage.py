"""Coverage: which ranks are in, and the wait for the rest bounded by the grace period."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path

from denpex.analysis.triage import take_inventory
from denpex.evidence.store import LocalStore
from denpex.workflow.coverage import Coverage, coverage_of, wait_for_coverage

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gloo" / "withheld_one"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _copy(tmp_path: Path, ranks: set[int], manifest: bool = True) -> Path:
    for rank in ranks:
        shutil.copy(FIXTURE / f"rank_{rank}.pkl", tmp_path)
    if manifest:
        shutil.copy(FIXTURE / "manifest.json", tmp_path)
    return tmp_path


def test_coverage_names_missing_ranks(tmp_path: Path) -> None:
    coverage = coverage_of(take_inventory(LocalStore(_copy(tmp_path, {0, 1, 3}))))
    assert (coverage.present, coverage.missing, coverage.complete) == ([0, 1, 3], [2], False)
    assert coverage.fraction == 0.75


def test_inferred_world_size_is_never_complete(tmp_path: Path) -> None:
    coverage = coverage_of(take_inventory(LocalStore(_copy(tmp_path, {0, 1, 2, 3}, manifest=False))))
    assert coverage.missing == [] and not coverage.world_size_known and not coverage.complete


def test_wait_returns_as_soon_as_every_rank_is_in(tmp_path: Path) -> None:
    store = LocalStore(_copy(tmp_path, {0, 1}))
    clock = FakeClock()
    seen: list[Coverage] = []

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 10:  # ranks 2 and 3 upload ten seconds after the alert
            _copy(tmp_path, {2, 3})

    inventory = wait_for_coverage(lambda: take_inventory(store), grace=timedelta(minutes=2),
                                  poll=timedelta(seconds=5), on_change=seen.append, clock=clock, sleep=sleep)
    assert sorted(inventory.dumps) == [0, 1, 2, 3]
    assert clock.now == 10
    assert [c.present for c in seen] == [[0, 1], [0, 1, 2, 3]]


def test_wait_ends_at_the_grace_period_with_what_is_there(tmp_path: Path) -> None:
    store = LocalStore(_copy(tmp_path, {0, 2, 3}))
    clock = FakeClock()
    inventory = wait_for_coverage(lambda: take_inventory(store), grace=timedelta(seconds=30),
                                  poll=timedelta(seconds=4), clock=clock, sleep=clock.sleep)
    assert sorted(inventory.dumps) == [0, 2, 3]
    assert clock.now == 30
