"""The approvers' TOTP second factor: enrolment, drift, one use per approver, one approver per code."""

from __future__ import annotations

import stat
import subprocess
import sys
import threading
from pathlib import Path

import pyotp
import pytest

from denpex.isolation.second_factor import LOCKOUT_S, MAX_WRONG_CODES, CodeVerdict, TotpStore

NOW = 1_764_547_215.0  # 15 s into a 30 s step


def test_enrolment_is_private_and_never_replaced(tmp_path: Path) -> None:
    store = TotpStore(tmp_path)
    uri = store.enroll("alice")
    assert uri.startswith("otpauth://totp/Denpex:alice?secret=") and "issuer=Denpex" in uri
    assert stat.S_IMODE((tmp_path / "approvers" / "totp" / "alice").stat().st_mode) == 0o600
    with pytest.raises(ValueError, match="already enrolled"):
        store.enroll("alice")
    with pytest.raises(ValueError, match="not plain"):
        store.enroll("../x")


def test_a_code_is_accepted_within_one_step_and_only_once(tmp_path: Path) -> None:
    store = TotpStore(tmp_path)
    store.enroll("alice")
    assert store.check("alice", store.current_code("alice", NOW - 30), at=NOW).accepted  # one step of drift
    assert store.check("alice", store.current_code("alice", NOW - 30), at=NOW).verdict is CodeVerdict.REUSED
    code = store.current_code("alice", NOW)
    assert store.check("alice", code, at=NOW).accepted
    again = store.check("alice", code, at=NOW)
    assert again.verdict is CodeVerdict.REUSED and "already used" in again.reason
    assert store.check("alice", store.current_code("alice", NOW - 60), at=NOW + 30).verdict is CodeVerdict.WRONG
    assert store.check("alice", store.current_code("alice", NOW + 90), at=NOW).verdict is CodeVerdict.WRONG


def test_a_code_proves_only_its_own_approver(tmp_path: Path) -> None:
    store = TotpStore(tmp_path)
    store.enroll("alice")
    store.enroll("bob")
    alices = store.current_code("alice", NOW)
    bob = store.check("bob", alices, at=NOW)
    assert bob.verdict is CodeVerdict.WRONG or alices == store.current_code("bob", NOW)
    assert store.check("mallory", alices, at=NOW).verdict is CodeVerdict.NOT_ENROLLED
    assert store.check("alice", "12345", at=NOW).verdict is CodeVerdict.MALFORMED
    assert store.check("alice", alices, at=NOW).accepted


def test_concurrent_workers_accept_one_code_once(tmp_path: Path) -> None:
    TotpStore(tmp_path).enroll("alice")
    code = TotpStore(tmp_path).current_code("alice", NOW)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(TotpStore(tmp_path).check("alice", code, at=NOW).accepted))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]


def test_enroll_command_prints_the_uri_and_a_qr_code(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "denpex", "approver", "enroll", "demo-operator",
                          "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    uri = out.stdout.split("authenticator app: ", 1)[1].split()[0]
    secret = pyotp.parse_uri(uri).secret
    assert secret == (tmp_path / "approvers" / "totp" / "demo-operator").read_text().strip()
    assert "\u2588" in out.stdout or "\u2580" in out.stdout  # the terminal QR code


def _wrong(store: TotpStore, approver: str, at: float) -> str:
    """A 6-digit code that none of the drift window's steps gives ``approver``."""
    valid = {store.current_code(approver, at=at + d * 30) for d in (-1, 0, 1)}
    return next(c for c in (f"{n:06d}" for n in range(1_000_000)) if c not in valid)


def test_guessing_locks_the_approver_out_for_the_window(tmp_path: Path) -> None:
    store = TotpStore(tmp_path)
    store.enroll("alice")
    store.enroll("bob")
    at = 1_800_000_000.0
    for i in range(MAX_WRONG_CODES):
        assert store.check("alice", _wrong(store, "alice", at + i), at=at + i).verdict is CodeVerdict.WRONG
    # Now even alice's right code is refused, and says why; bob is not affected.
    locked = store.check("alice", store.current_code("alice", at=at + 10), at=at + 10)
    assert locked.verdict is CodeVerdict.LOCKED and "5 wrong codes for alice" in locked.reason
    assert store.check("bob", store.current_code("bob", at=at + 10), at=at + 10).accepted
    # Once the window has passed since the wrong codes, alice's current code works again.
    later = at + LOCKOUT_S + MAX_WRONG_CODES + 1
    assert store.check("alice", store.current_code("alice", at=later), at=later).accepted


def test_a_strangers_guesses_do_not_lock_the_approver_out_of_their_own_desk(tmp_path: Path) -> None:
    store = TotpStore(tmp_path)
    store.enroll("alice")
    at = 1_800_000_000.0
    assert store.check("alice", store.current_code("alice", at=at), at=at, source="10.0.0.7").accepted
    for i in range(1, MAX_WRONG_CODES + 1):  # a stranger, from two addresses
        guess = _wrong(store, "alice", at + i)
        assert store.check("alice", guess, at=at + i, source=f"10.6.6.{i % 2}").verdict is CodeVerdict.WRONG
    later = at + 60
    code = store.current_code("alice", at=later)
    # Every address alice has not approved from is locked, her right code included ...
    for source in ("10.6.6.1", "10.0.0.8", None):
        refused = store.check("alice", code, at=later, source=source)
        assert refused.verdict is CodeVerdict.LOCKED and "5 wrong codes for alice" in refused.reason
    # ... and her own desk is not: the stranger's guesses do not count there.
    assert store.check("alice", code, at=later, source="10.0.0.7").accepted
    # Her desk has its own bound: five wrong codes from it lock it too.
    for i in range(MAX_WRONG_CODES):
        store.check("alice", _wrong(store, "alice", later + 1 + i), at=later + 1 + i, source="10.0.0.7")
    last = later + 30 + MAX_WRONG_CODES
    locked = store.check("alice", store.current_code("alice", at=last), at=last, source="10.0.0.7")
    assert locked.verdict is CodeVerdict.LOCKED and "from 10.0.0.7" in locked.reason


def test_a_used_file_from_before_sources_were_kept_is_extended(tmp_path: Path) -> None:
    import sqlite3

    store = TotpStore(tmp_path)
    store.enroll("alice")
    at = 1_800_000_000.0
    with sqlite3.connect(store.db_path) as db:  # the schema of the previous release, with a wrong code in it
        db.execute("CREATE TABLE used (approver TEXT PRIMARY KEY, step INTEGER NOT NULL)")
        db.execute("CREATE TABLE wrong (approver TEXT NOT NULL, at REAL NOT NULL)")
        db.executemany("INSERT INTO wrong VALUES ('alice', ?)", [(at + i,) for i in range(MAX_WRONG_CODES)])
    locked = store.check("alice", store.current_code("alice", at=at + 10), at=at + 10, source="10.0.0.7")
    assert locked.verdict is CodeVerdict.LOCKED  # the old rows still count, for every source
    later = at + LOCKOUT_S + MAX_WRONG_CODES
    assert store.check("alice", store.current_code("alice", at=later), at=later, source="10.0.0.7").accepted


def test_workers_extending_an_old_file_at_once_all_get_an_answer(tmp_path: Path) -> None:
    import sqlite3
    from concurrent.futures import ThreadPoolExecutor

    at = 1_800_000_000.0
    for trial in range(10):
        store = TotpStore(tmp_path / str(trial))
        store.enroll("alice")
        with sqlite3.connect(store.db_path) as db:
            db.execute("CREATE TABLE wrong (approver TEXT NOT NULL, at REAL NOT NULL)")
        guess = _wrong(store, "alice", at)
        with ThreadPoolExecutor(4) as pool:  # an exception here would be a 500 on the page
            verdicts = list(pool.map(lambda i: store.check("alice", guess, at=at, source=f"s{i}").verdict, range(4)))
        assert verdicts == [CodeVerdict.WRONG] * 4


def test_malformed_codes_are_not_counted_as_guesses(tmp_path: Path) -> None:
    store = TotpStore(tmp_path)
    store.enroll("alice")
    at = 1_800_000_000.0
    for _ in range(MAX_WRONG_CODES * 2):
        assert store.check("alice", "12345", at=at).verdict is CodeVerdict.MALFORMED
    assert store.check("alice", store.current_code("alice", at=at), at=at).accepted
