"""The spool's bounds, in process: bodies in flight, disk, the body deadline, and cleanup."""

from __future__ import annotations

import asyncio
import hashlib
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from denpex.ingest.body_spool import BodySpool, SpoolBusyError, SpoolLimits, spool_body
from denpex.ingest.errors import PayloadTooLargeError, RequestTimeoutError


async def _chunks(parts: list[bytes], pause_s: float = 0.0) -> AsyncIterator[bytes]:
    for part in parts:
        if pause_s:
            await asyncio.sleep(pause_s)
        yield part


def test_a_body_is_spooled_hashed_private_and_removed_with_its_slot(tmp_path: Path) -> None:
    spool = BodySpool(SpoolLimits(tmp_path / "spool"))
    with spool.admit(6, source="key:a") as slot:
        body = asyncio.run(spool_body(_chunks([b"hel", b"lo!"]), slot, cap=10, deadline_s=5))
        assert body.path.read_bytes() == b"hello!" and body.sha256 == hashlib.sha256(b"hello!").hexdigest()
        assert stat.S_IMODE(body.path.stat().st_mode) == 0o600
        assert spool.reserved_bytes == 6
    assert list((tmp_path / "spool").iterdir()) == [] and spool.reserved_bytes == 0


def test_bodies_in_flight_and_disk_are_bounded(tmp_path: Path) -> None:
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_in_flight=2, max_disk_bytes=100))
    with spool.admit(60, source="key:a"), spool.admit(None, source="key:b"):
        with pytest.raises(SpoolBusyError, match="receiving 2 bodies") as busy:
            with spool.admit(1, source="key:c"):
                pass
        assert busy.value.status == 503 and busy.value.retry_after_s >= 1
    with spool.admit(60, source="key:a"):
        with pytest.raises(SpoolBusyError, match="spool is full"):
            with spool.admit(41, source="key:a"):
                pass
        with spool.admit(None, source="key:a") as slot:  # a chunked body: charged as it arrives
            with pytest.raises(SpoolBusyError, match="spool is full"):
                asyncio.run(spool_body(_chunks([b"x" * 30, b"x" * 30]), slot, cap=1000, deadline_s=5))
    assert spool.reserved_bytes == 0 and list((tmp_path / "spool").iterdir()) == []


def test_a_body_past_its_cap_or_its_deadline_is_refused(tmp_path: Path) -> None:
    spool = BodySpool(SpoolLimits(tmp_path / "spool"))
    with spool.admit(None, source="key:a") as slot, pytest.raises(PayloadTooLargeError):
        asyncio.run(spool_body(_chunks([b"x" * 8, b"x" * 8]), slot, cap=10, deadline_s=5))
    with spool.admit(None, source="key:a") as slot, pytest.raises(RequestTimeoutError, match="longer than"):
        asyncio.run(spool_body(_chunks([b"x"] * 50, pause_s=0.05), slot, cap=100, deadline_s=0.3))
    assert list((tmp_path / "spool").iterdir()) == []


def test_a_trickle_is_cut_off_after_the_grace_not_at_the_deadline(tmp_path: Path) -> None:
    """A byte now and then (a hostile client's way to hold a slot) is cut off once it falls behind
    the minimum rate, long before its deadline; a body that keeps the rate arrives whole."""
    import time

    spool = BodySpool(SpoolLimits(tmp_path / "spool", min_rate_bytes_s=100, grace_s=0.3))
    started = time.monotonic()
    with spool.admit(None, source="key:a") as slot, pytest.raises(RequestTimeoutError, match="slower than 100 bytes/s"):
        asyncio.run(spool_body(_chunks([b"x"] * 100, pause_s=0.1), slot, cap=1000, deadline_s=60))
    assert time.monotonic() - started < 30  # far short of the 60 s deadline, even on a loaded machine
    with spool.admit(None, source="key:a") as slot:  # 1,000 bytes/s: ten times the minimum
        body = asyncio.run(spool_body(_chunks([b"x" * 100] * 10, pause_s=0.1), slot, cap=2000, deadline_s=60))
    assert body.size == 1000
    assert list((tmp_path / "spool").iterdir()) == []


def test_one_source_cannot_take_the_whole_pool_nor_starve_bearer_alerts(tmp_path: Path) -> None:
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_in_flight=4, max_in_flight_per_source=2))
    with spool.admit(None, source="key:victim"), spool.admit(None, source="key:victim"):
        with pytest.raises(SpoolBusyError, match="this sender has 2 bodies"):
            with spool.admit(None, source="key:victim"):
                pass
        with spool.admit(None, source="key:other"), spool.admit(None, source="key:third"):
            # The signed pool is full; an authenticated bearer delivery still gets a slot.
            with pytest.raises(SpoolBusyError, match="receiving 4 bodies"):
                with spool.admit(None, source="key:fourth"):
                    pass
            with spool.admit(None, source="bearer:acme/lab", authenticated=True):
                pass
    with spool.admit(None, source="key:victim"):  # every slot was given back
        pass
    assert list((tmp_path / "spool").iterdir()) == []


def test_the_deadline_grows_with_the_size_up_to_its_cap() -> None:
    limits = SpoolLimits(Path("/s"), min_rate_bytes_s=1000, grace_s=10, max_body_s=100)
    assert limits.deadline_s(5000, 10**9) == 15
    assert limits.deadline_s(None, 10**9) == 100


def test_orphans_of_a_dead_process_are_removed_at_start(tmp_path: Path) -> None:
    folder = tmp_path / "spool"
    folder.mkdir()
    (folder / "999999999-ab.body").write_bytes(b"left by a crash")
    BodySpool(SpoolLimits(folder))
    assert list(folder.iterdir()) == []


def test_a_body_that_sends_no_byte_is_cut_off_after_the_grace(tmp_path: Path) -> None:
    """Headers, then silence: the slot is given back once the grace is over (the first deadline
    is a loop time, not a delay measured from the loop's own clock)."""
    import time

    async def silent() -> AsyncIterator[bytes]:
        await asyncio.sleep(30)
        yield b"x"

    spool = BodySpool(SpoolLimits(tmp_path / "spool", grace_s=0.3))
    started = time.monotonic()
    with spool.admit(None, source="key:a") as slot, pytest.raises(RequestTimeoutError, match="slower than"):
        asyncio.run(spool_body(silent(), slot, cap=1000, deadline_s=60))
    assert time.monotonic() - started < 30  # far short of the 60 s deadline, even on a loaded machine


def test_unverified_bodies_leave_a_share_of_the_disk_to_authenticated_ones(tmp_path: Path) -> None:
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_disk_bytes=100, max_in_flight_per_source=8))
    with spool.admit(40, source="key:a"), spool.admit(35, source="key:b"):
        with pytest.raises(SpoolBusyError, match="spool is full for bodies not yet verified"):
            with spool.admit(1, source="key:c"):
                pass
        with spool.admit(25, source="bearer:acme/lab", authenticated=True):
            pass
    assert spool.reserved_bytes == 0
