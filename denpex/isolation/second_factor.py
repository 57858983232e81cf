"""A second factor for approvals made in the Prefect UI: each approver's TOTP (RFC 6238).

Whoever reaches the Prefect API can resume a paused run and type any approver's name. A current
one-time code from the approver's authenticator proves the person, as the CLI's ed25519
signature does. The rules:

- one secret per approver, enrolled by the operator (``denpex approver enroll NAME``), stored in
  the state directory readable by the service user only (``approvers/totp/NAME``, mode 0600);
- a code is accepted within RFC 6238's usual drift window, one 30 s step either way, of the
  moment it arrived (``typed_at``: the flow measures it on the Prefect API's clock) or else now;
- a code is accepted once per approver: the newest accepted time step is kept in the state
  directory's SQLite file (shared by every worker, updated in one write transaction), and a code
  of that step or an older one is refused;
- a code proves only the approver it was enrolled for: another approver's code fails;
- guessing is bounded: after ``MAX_WRONG_CODES`` wrong codes for one approver within
  ``LOCKOUT_S``, every code for that approver is refused until the window has passed (a lockout
  is recorded in the same SQLite file; the operator sees it in the refusal's reason);
- a stranger's guesses do not lock the approver out of their own desk: where the caller says
  where a code came from (``source``: the approval page's client address), the approver-wide
  lockout holds only for sources the approver has not had a code accepted from in the last
  ``KNOWN_SOURCE_S``. A known source has its own lockout, for that approver from that source.
  Guessing stays bounded: an unknown source gets the same ``MAX_WRONG_CODES`` per window as
  before, shared by every unknown source, and each known source as many again.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pyotp

__all__ = ["CodeVerdict", "CodeCheck", "TotpStore", "TOTP_ISSUER", "MAX_WRONG_CODES", "LOCKOUT_S", "KNOWN_SOURCE_S"]

TOTP_ISSUER = "Denpex"
_STEP_S = 30
_DRIFT_STEPS = 1
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")
_CODE = re.compile(r"\d{6}")
MAX_WRONG_CODES = 5
LOCKOUT_S = 15 * 60
KNOWN_SOURCE_S = 30 * 24 * 3600
"""How long a source an approver's code was accepted from stays exempt from the approver-wide lockout."""


class CodeVerdict(StrEnum):
    ACCEPTED = "accepted"
    NOT_ENROLLED = "not_enrolled"
    MALFORMED = "malformed"
    WRONG = "wrong"
    REUSED = "reused"
    LOCKED = "locked"
    """Too many wrong codes for this approver lately: every code is refused for a while."""


@dataclass(frozen=True, slots=True)
class CodeCheck:
    """The outcome of one code, with the sentence that is recorded when it is refused."""

    verdict: CodeVerdict
    reason: str

    @property
    def accepted(self) -> bool:
        return self.verdict is CodeVerdict.ACCEPTED


class TotpStore:
    """Approvers' TOTP secrets and their used time steps, under one state directory."""

    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / "approvers" / "totp"
        self.db_path = state_dir / "approvers" / "totp-used.sqlite3"

    def enroll(self, approver: str) -> str:
        """Create ``approver``'s secret (never replacing one) and return its otpauth URI."""
        name = _check_name(approver)
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        secret = pyotp.random_base32()
        try:
            fd = os.open(self.folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError as exc:
            raise ValueError(f"{approver!r} is already enrolled; remove {self.folder / name} to enroll again "
                             "(the old authenticator entry stops working)") from exc
        with os.fdopen(fd, "w") as handle:
            handle.write(secret + "\n")
        return self.uri(approver)

    def uri(self, approver: str) -> str:
        """The otpauth URI an authenticator app reads (shown as a QR code)."""
        return pyotp.TOTP(self._secret(approver)).provisioning_uri(name=approver, issuer_name=TOTP_ISSUER)

    def enrolled(self, approver: str) -> bool:
        return _NAME.fullmatch(approver) is not None and (self.folder / approver).is_file()

    def current_code(self, approver: str, at: float | None = None) -> str:
        """The code the approver's authenticator shows now (for the demo and tests)."""
        return pyotp.TOTP(self._secret(approver)).at(int(time.time() if at is None else at))

    def check(self, approver: str, code: str, *, at: float | None = None, typed_at: float | None = None,
              source: str | None = None, vouched: bool = False) -> CodeCheck:
        """Accept ``code`` for ``approver`` once, within one step of drift; see the module docstring.

        ``at`` is now (default: the clock); ``typed_at``, when given, is the moment the code is
        matched at (when the answer carrying it arrived). Wrong codes are counted at ``at``, so a
        receipt time never moves a guess out of the lockout window. ``source`` is where the code
        came from (None: unknown, and every wrong code for the approver counts against it).
        ``vouched``: something else already proved the person at ``source`` (an authenticating
        proxy's identity), so it is treated as known from the first code."""
        if not self.enrolled(approver):
            return CodeCheck(CodeVerdict.NOT_ENROLLED, f"{approver!r} has no enrolled TOTP secret; the operator "
                                                       f"enrolls one with `denpex approver enroll {approver}`")
        given = code.strip().replace(" ", "")
        if not _CODE.fullmatch(given):
            return CodeCheck(CodeVerdict.MALFORMED, "the code must be the 6 digits the authenticator shows")
        now = time.time() if at is None else at
        totp = pyotp.TOTP(self._secret(approver))
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")  # one decision at a time per state directory: no race to a lockout
            db.execute("DELETE FROM wrong WHERE at <= ?", (now - LOCKOUT_S,))
            db.execute("DELETE FROM known WHERE at <= ?", (now - KNOWN_SOURCE_S,))
            locked = _lockout(db, approver, source, now, vouched=vouched)
            if locked is not None:
                db.execute("COMMIT")
                return CodeCheck(CodeVerdict.LOCKED, locked)
            step = _matching_step(totp, given, now if typed_at is None else typed_at)
            if step is None:
                db.execute("INSERT INTO wrong (approver, at, source) VALUES (?, ?, ?)", (approver, now, source))
                db.execute("COMMIT")
                return CodeCheck(CodeVerdict.WRONG, f"the code is not {approver}'s current code (wrong, expired, or "
                                                    "another approver's)")
            row = db.execute("SELECT step FROM used WHERE approver = ?", (approver,)).fetchone()
            if row is not None and row[0] >= step:
                db.execute("COMMIT")
                return CodeCheck(CodeVerdict.REUSED, f"{approver}'s code was already used; wait for the next code")
            db.execute("INSERT INTO used (approver, step) VALUES (?, ?) ON CONFLICT(approver) DO UPDATE SET "
                       "step = excluded.step", (approver, step))
            if source is not None:
                db.execute("INSERT INTO known (approver, source, at) VALUES (?, ?, ?) ON CONFLICT(approver, source) "
                           "DO UPDATE SET at = excluded.at", (approver, source, now))
            db.execute("COMMIT")
        return CodeCheck(CodeVerdict.ACCEPTED, f"{approver}'s current TOTP code")

    def _secret(self, approver: str) -> str:
        name = _check_name(approver)
        try:
            return (self.folder / name).read_text().strip()
        except FileNotFoundError as exc:
            raise ValueError(f"{approver!r} is not enrolled; run `denpex approver enroll {approver}`") from exc

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """The used-steps and wrong-codes file (mode 0600), in autocommit mode for explicit
        transactions: shared by every worker of this state directory."""
        self.db_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.db_path.exists():
            os.close(os.open(self.db_path, os.O_CREAT | os.O_WRONLY, 0o600))
        db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        try:
            db.execute("CREATE TABLE IF NOT EXISTS used (approver TEXT PRIMARY KEY, step INTEGER NOT NULL)")
            db.execute("CREATE TABLE IF NOT EXISTS wrong (approver TEXT NOT NULL, at REAL NOT NULL, source TEXT)")
            if "source" not in {row[1] for row in db.execute("PRAGMA table_info(wrong)")}:
                _add_source_column(db)
            db.execute("CREATE TABLE IF NOT EXISTS known (approver TEXT NOT NULL, source TEXT NOT NULL, "
                       "at REAL NOT NULL, PRIMARY KEY (approver, source))")
            yield db
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()


def _add_source_column(db: sqlite3.Connection) -> None:
    """Extend a file from before sources were kept; another worker may be doing the same."""
    db.execute("BEGIN IMMEDIATE")
    try:
        if "source" not in {row[1] for row in db.execute("PRAGMA table_info(wrong)")}:
            db.execute("ALTER TABLE wrong ADD COLUMN source TEXT")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _lockout(db: sqlite3.Connection, approver: str, source: str | None, now: float, *, vouched: bool) -> str | None:
    """Why ``approver``'s codes from ``source`` are refused now, or None when they may be tried."""
    since = now - LOCKOUT_S
    window = f"in the last {LOCKOUT_S // 60} minutes"
    known = source is not None and (vouched or db.execute(
        "SELECT 1 FROM known WHERE approver = ? AND source = ?", (approver, source)).fetchone() is not None)
    if known:  # the approver's own desk: only wrong codes from it count
        mine = db.execute("SELECT COUNT(*) FROM wrong WHERE approver = ? AND source = ? AND at > ?",
                          (approver, source, since)).fetchone()[0]
        if mine >= MAX_WRONG_CODES:
            return (f"{mine} wrong codes for {approver} from {source} {window}: {approver}'s codes from there are "
                    "refused until that window has passed")
        return None
    wrong = db.execute("SELECT COUNT(*) FROM wrong WHERE approver = ? AND at > ?", (approver, since)).fetchone()[0]
    if wrong < MAX_WRONG_CODES:
        return None
    refused = (f"{approver}'s codes are refused until that window has passed" if source is None else
               f"{approver}'s codes are refused from here until that window has passed (from where {approver}'s "
               "code was accepted before, only the wrong codes sent from there count)")
    return f"{wrong} wrong codes for {approver} {window}: {refused}"


def _matching_step(totp: pyotp.TOTP, code: str, now: float) -> int | None:
    """The time step (within the drift window) whose code is ``code``; compared in constant time."""
    import hmac

    current = int(now) // _STEP_S
    found = None
    for step in range(current - _DRIFT_STEPS, current + _DRIFT_STEPS + 1):
        if hmac.compare_digest(totp.at(step * _STEP_S), code):
            found = step
    return found


def _check_name(approver: str) -> str:
    if not _NAME.fullmatch(approver):
        raise ValueError(f"approver name {approver!r} is not plain (A-Za-z0-9._@-, at most 128)")
    return approver
