"""The spool's bounds, in process: bodies in flight, disk, the body deadline, and cleanup."""

from __future__ import annotations

import asyncio
import hashlib
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from denpex.ingest.body_spool import BodySpool, SpoolBusyError, SpoolLimits, SpoolPool, spool_body
from denpex.ingest.errors import AuthenticationError, PayloadTooLargeError, RequestTimeoutError
from denpex.ingest.signing import DeclaredBody

SIGNED = SpoolPool.SIGNED


async def _chunks(parts: list[bytes], pause_s: float = 0.0) -> AsyncIterator[bytes]:
    for part in parts:
        if pause_s:
            await asyncio.sleep(pause_s)
        yield part


def test_a_body_is_spooled_hashed_private_and_removed_with_its_slot(tmp_path: Path) -> None:
    spool = BodySpool(SpoolLimits(tmp_path / "spool"))
    with spool.admit(6, pool=SIGNED, source="key:a") as slot:
        body = asyncio.run(spool_body(_chunks([b"hel", b"lo!"]), slot, cap=10, deadline_s=5))
        assert body.path.read_bytes() == b"hello!" and body.sha256 == hashlib.sha256(b"hello!").hexdigest()
        assert stat.S_IMODE(body.path.stat().st_mode) == 0o600
        assert spool.reserved_bytes == 6
    assert list((tmp_path / "spool").iterdir()) == [] and spool.reserved_bytes == 0


def test_bodies_in_flight_and_disk_are_bounded(tmp_path: Path) -> None:
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_in_flight=2, max_disk_bytes=100, max_bytes_per_key=100,
                                  max_unverified_bytes=0, max_bearer_bytes=0))
    with spool.admit(60, pool=SIGNED, source="key:a"), spool.admit(None, pool=SIGNED, source="key:b"):
        with pytest.raises(SpoolBusyError, match="receiving 2 signed bodies") as busy:
            with spool.admit(1, pool=SIGNED, source="key:c"):
                pass
        assert busy.value.status == 503 and busy.value.retry_after_s >= 1
    with spool.admit(60, pool=SIGNED, source="key:a"):
        with pytest.raises(SpoolBusyError, match="spool is full"):
            with spool.admit(41, pool=SIGNED, source="key:a"):
                pass
        with spool.admit(None, pool=SIGNED, source="key:a") as slot:  # a chunked body: charged as it arrives
            with pytest.raises(SpoolBusyError, match="spool is full"):
                asyncio.run(spool_body(_chunks([b"x" * 30, b"x" * 30]), slot, cap=1000, deadline_s=5))
    assert spool.reserved_bytes == 0 and list((tmp_path / "spool").iterdir()) == []


def test_one_key_holds_at_most_its_share_of_the_signed_pool(tmp_path: Path) -> None:
    """Issue 30, §2: a key that holds its secret (a compromised job's) cannot take the spool from the others."""
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_disk_bytes=1000, max_bytes_per_key=300))
    with spool.admit(200, pool=SIGNED, source="key:greedy") as slot:
        with pytest.raises(SpoolBusyError, match="past its share of 300"):
            with spool.admit(101, pool=SIGNED, source="key:greedy"):
                pass
        with spool.admit(50, pool=SIGNED, source="key:greedy"):
            with pytest.raises(SpoolBusyError, match="past its share of 300"):  # bytes written past the reservation too
                slot.charge(251)
        with spool.admit(300, pool=SIGNED, source="key:other"):
            assert spool.reserved_in(SIGNED) == 500
    with spool.admit(200, pool=SIGNED, source="key:greedy") as slot:
        with pytest.raises(PayloadTooLargeError, match="needs 301 bytes of spool, more than its sender may ever hold"):
            slot.charge(301)  # no retry can ever fit: 413, not 503
        with pytest.raises(PayloadTooLargeError, match="needs 301 bytes"):
            with spool.admit(301, pool=SIGNED, source="key:other"):
                pass
    assert spool.reserved_bytes == 0


def test_a_verified_v1_body_leaves_the_unverified_allowance(tmp_path: Path) -> None:
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_disk_bytes=1600))  # 100 for v1 bodies, 50 per key id
    with spool.admit(50, pool=SpoolPool.UNVERIFIED, source="key:a") as slot:
        with pytest.raises(SpoolBusyError, match="past its share of 50.*sign v2"):
            with spool.admit(1, pool=SpoolPool.UNVERIFIED, source="key:a"):
                pass
        spool.promote(slot, pool=SIGNED, source="key:a")
        assert (spool.reserved_in(SpoolPool.UNVERIFIED), spool.reserved_in(SIGNED)) == (0, 50)
        with spool.admit(50, pool=SpoolPool.UNVERIFIED, source="key:a"):  # the allowance is free again
            pass
        slot.charge(80)  # the dump part copied out of the body: charged to the signed pool now
        assert spool.reserved_in(SIGNED) == 80
    assert spool.reserved_bytes == 0


def test_the_shares_must_fit_the_spool(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="leave nothing for signed bodies"):
        SpoolLimits(tmp_path, max_disk_bytes=100, max_unverified_bytes=80, max_bearer_bytes=20)


def test_a_v2_body_must_be_the_declared_one(tmp_path: Path) -> None:
    spool = BodySpool(SpoolLimits(tmp_path / "spool"))
    declared = DeclaredBody(length=6, sha256=hashlib.sha256(b"hello!").hexdigest())
    with spool.admit(6, pool=SIGNED, source="key:a") as slot:
        body = asyncio.run(spool_body(_chunks([b"hel", b"lo!"]), slot, cap=10, deadline_s=5, declared=declared))
        assert body.sha256 == declared.sha256
    cases = {"other bytes": [b"hello?"], "7 bytes": [b"hello", b"!!"], "5 bytes": [b"hello"]}
    for what, chunks in cases.items():
        with spool.admit(6, pool=SIGNED, source="key:a") as slot, pytest.raises(AuthenticationError, match=what):
            asyncio.run(spool_body(_chunks(chunks), slot, cap=10, deadline_s=5, declared=declared))
        assert slot.used <= 6  # nothing written past what was signed and reserved
    assert list((tmp_path / "spool").iterdir()) == []


def test_a_body_past_its_cap_or_its_deadline_is_refused(tmp_path: Path) -> None:
    spool = BodySpool(SpoolLimits(tmp_path / "spool"))
    with spool.admit(None, pool=SIGNED, source="key:a") as slot, pytest.raises(PayloadTooLargeError):
        asyncio.run(spool_body(_chunks([b"x" * 8, b"x" * 8]), slot, cap=10, deadline_s=5))
    with spool.admit(None, pool=SIGNED, source="key:a") as slot, pytest.raises(RequestTimeoutError, match="longer than"):
        asyncio.run(spool_body(_chunks([b"x"] * 50, pause_s=0.05), slot, cap=100, deadline_s=0.3))
    assert list((tmp_path / "spool").iterdir()) == []


def test_a_trickle_is_cut_off_after_the_grace_not_at_the_deadline(tmp_path: Path) -> None:
    """A byte now and then (a hostile client's way to hold a slot) is cut off once it falls behind
    the minimum rate, long before its deadline; a body that keeps the rate arrives whole."""
    import time

    spool = BodySpool(SpoolLimits(tmp_path / "spool", min_rate_bytes_s=100, grace_s=0.3))
    started = time.monotonic()
    with spool.admit(None, pool=SIGNED, source="key:a") as slot, pytest.raises(RequestTimeoutError, match="slower than 100 bytes/s"):
        asyncio.run(spool_body(_chunks([b"x"] * 100, pause_s=0.1), slot, cap=1000, deadline_s=60))
    assert time.monotonic() - started < 30  # far short of the 60 s deadline, even on a loaded machine
    with spool.admit(None, pool=SIGNED, source="key:a") as slot:  # 1,000 bytes/s: ten times the minimum
        body = asyncio.run(spool_body(_chunks([b"x" * 100] * 10, pause_s=0.1), slot, cap=2000, deadline_s=60))
    assert body.size == 1000
    assert list((tmp_path / "spool").iterdir()) == []


def test_one_source_cannot_take_the_whole_pool_nor_starve_bearer_alerts(tmp_path: Path) -> None:
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_in_flight=4, max_in_flight_per_source=2))
    with spool.admit(None, pool=SIGNED, source="key:victim"), spool.admit(None, pool=SIGNED, source="key:victim"):
        with pytest.raises(SpoolBusyError, match="this sender has 2 bodies"):
            with spool.admit(None, pool=SIGNED, source="key:victim"):
                pass
        with spool.admit(None, pool=SIGNED, source="key:other"), spool.admit(None, pool=SIGNED, source="key:third"):
            # The signed pool is full; a bearer delivery and a v1 body (its own key id) still get a slot.
            with pytest.raises(SpoolBusyError, match="receiving 4 signed bodies"):
                with spool.admit(None, pool=SIGNED, source="key:fourth"):
                    pass
            with spool.admit(None, pool=SpoolPool.BEARER, source="bearer:acme/lab"):
                pass
            with spool.admit(None, pool=SpoolPool.UNVERIFIED, source="key:victim"):
                pass
    with spool.admit(None, pool=SIGNED, source="key:victim"):  # every slot was given back
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
    with spool.admit(None, pool=SIGNED, source="key:a") as slot, pytest.raises(RequestTimeoutError, match="slower than"):
        asyncio.run(spool_body(silent(), slot, cap=1000, deadline_s=60))
    assert time.monotonic() - started < 30  # far short of the 60 s deadline, even on a loaded machine


def test_each_pool_has_its_bytes_so_unverified_bodies_starve_no_one(tmp_path: Path) -> None:
    """Issue 30, §2: strangers' v1 bodies fill their allowance and nothing else."""
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_disk_bytes=6400, max_in_flight_per_source=8))
    # 400 for unverified bodies (200 per key id), 100 for bearer alerts, 5,900 for signed bodies.
    with spool.admit(200, pool=SpoolPool.UNVERIFIED, source="key:a"), \
            spool.admit(200, pool=SpoolPool.UNVERIFIED, source="key:b"):
        with pytest.raises(SpoolBusyError, match="full for unverified bodies"):
            with spool.admit(1, pool=SpoolPool.UNVERIFIED, source="key:c"):
                pass
        with spool.admit(50, pool=SpoolPool.BEARER, source="bearer:acme/lab"), \
                spool.admit(50, pool=SpoolPool.BEARER, source="bearer:acme/c2"), \
                spool.admit(1600, pool=SIGNED, source="key:a"):
            with pytest.raises(SpoolBusyError, match="full for bearer bodies"):
                with spool.admit(1, pool=SpoolPool.BEARER, source="bearer:globex/g1"):
                    pass
    assert spool.reserved_bytes == 0


def test_a_tenant_gains_nothing_by_holding_more_keys(tmp_path: Path) -> None:
    """Issue 30, the red team's A10: one tenant with eight keys held all 64 signed slots (eight per
    key) and every other tenant got 503. Its keys together now hold a quarter of the slots and what
    one key may of the disk; another tenant's keys are untouched."""
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_in_flight=8, max_in_flight_per_source=2,
                                  max_disk_bytes=1000, max_bytes_per_key=300, max_unverified_bytes=0,
                                  max_bearer_bytes=0))
    assert (spool.limits.tenant_in_flight(), spool.limits.tenant_bytes()) == (2, 300)
    with spool.admit(None, pool=SIGNED, source="key:g1", tenant="globex"), \
            spool.admit(None, pool=SIGNED, source="key:g2", tenant="globex"):
        with pytest.raises(SpoolBusyError, match="this tenant's senders have 2 signed bodies arriving") as busy:
            with spool.admit(None, pool=SIGNED, source="key:g3", tenant="globex"):
                pass
        assert busy.value.status == 503 and busy.value.retry_after_s >= 1
        with spool.admit(300, pool=SIGNED, source="key:a1", tenant="acme"):  # another tenant keeps its share
            pass
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_disk_bytes=1000, max_bytes_per_key=300,
                                  max_unverified_bytes=0, max_bearer_bytes=0))
    with spool.admit(200, pool=SIGNED, source="key:g1", tenant="globex"):
        with pytest.raises(SpoolBusyError, match="past the tenant's share of 300"):
            with spool.admit(101, pool=SIGNED, source="key:g2", tenant="globex"):
                pass
        with spool.admit(300, pool=SIGNED, source="key:a1", tenant="acme"):
            assert spool.reserved_in(SIGNED) == 500
    assert spool.reserved_bytes == 0 and list((tmp_path / "spool").iterdir()) == []


def test_a_verified_v1_body_counts_against_its_tenant_only_once_verified(tmp_path: Path) -> None:
    """An unverified body proves no tenant (a key id is no secret): a stranger naming globex's key
    ids takes none of globex's tenant share; once verified, the body is globex's."""
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_disk_bytes=1600, max_in_flight=8,
                                  max_in_flight_per_source=8, max_in_flight_per_tenant=1))
    with spool.admit(10, pool=SpoolPool.UNVERIFIED, source="key:g1", tenant="globex") as forged, \
            spool.admit(10, pool=SpoolPool.UNVERIFIED, source="key:g2", tenant="globex"):
        assert forged.tenant is None
        with spool.admit(None, pool=SIGNED, source="key:g3", tenant="globex"):  # the one slot of globex
            with pytest.raises(SpoolBusyError, match="this tenant's senders have 1 signed bodies"):
                spool.promote(forged, pool=SIGNED, source="key:g1", tenant="globex")
            assert (forged.pool, spool.reserved_in(SpoolPool.UNVERIFIED)) == (SpoolPool.UNVERIFIED, 20)
        spool.promote(forged, pool=SIGNED, source="key:g1", tenant="globex")
        assert (forged.tenant, spool.reserved_in(SIGNED)) == ("globex", 10)
    assert spool.reserved_bytes == 0


def test_a_tenant_gains_nothing_by_holding_more_bearer_tokens(tmp_path: Path) -> None:
    """The same bound for Alertmanager bodies: a tenant's tokens for many clusters hold together what
    one may (half the bearer pool) and a quarter of the slots; another tenant's alerts still get in."""
    spool = BodySpool(SpoolLimits(tmp_path / "spool", max_in_flight=12, max_disk_bytes=6400))  # 100 for bearer bodies
    with spool.admit(30, pool=SpoolPool.BEARER, source="bearer:globex/g1", tenant="globex"), \
            spool.admit(20, pool=SpoolPool.BEARER, source="bearer:globex/g2", tenant="globex"):
        with pytest.raises(SpoolBusyError, match="past the tenant's share of 50"):
            with spool.admit(1, pool=SpoolPool.BEARER, source="bearer:globex/g3", tenant="globex"):
                pass
        with spool.admit(None, pool=SpoolPool.BEARER, source="bearer:globex/g3", tenant="globex"):
            with pytest.raises(SpoolBusyError, match="this tenant's senders have 3 bearer bodies arriving"):
                with spool.admit(None, pool=SpoolPool.BEARER, source="bearer:globex/g4", tenant="globex"):
                    pass
        with spool.admit(50, pool=SpoolPool.BEARER, source="bearer:acme/c1", tenant="acme"):
            assert spool.reserved_in(SpoolPool.BEARER) == 100
    assert spool.reserved_bytes == 0


def test_a_bound_of_zero_is_refused_when_the_spool_is_set_up() -> None:
    with pytest.raises(ValueError, match="max_in_flight_per_tenant must be at least 1, not 0"):
        SpoolLimits(Path("/s"), max_in_flight_per_tenant=0)
    with pytest.raises(ValueError, match="max_bytes_per_tenant must be at least 1"):
        SpoolLimits(Path("/s"), max_bytes_per_tenant=-5)
