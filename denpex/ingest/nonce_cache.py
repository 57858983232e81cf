"""The replay cache: each (key, nonce) is accepted once, and remembered across restarts.

A nonce only has to be remembered for as long as its timestamp could still pass the skew check
(twice the window, to cover a timestamp that was ahead of the clock), so entries expire then.

A request's nonce is looked at twice: :meth:`NonceCache.check_unused` reads, from the headers
alone, before any body byte is read (a replay is refused at once); :meth:`NonceCache.claim`
records it only once the signature verified, atomically (the primary key decides between two
requests racing with one nonce), so a forged request cannot burn a genuine request's nonce.
"""

from __future__ import annotations

import sqlite3

from denpex.ingest.database import Database
from denpex.ingest.errors import AuthenticationError
from denpex.ingest.signing import MAX_CLOCK_SKEW_S

__all__ = ["NonceCache"]


class NonceCache:
    """Remembers nonces in the state database."""

    def __init__(self, db: Database, ttl_s: float = 2 * MAX_CLOCK_SKEW_S + 60) -> None:
        self._db = db
        self._ttl_s = ttl_s

    def check_unused(self, key_id: str, nonce: str, now: float) -> None:
        """Refuse (401) a nonce already used with this key and not yet expired; records nothing."""
        with self._db.connect() as db:
            row = db.execute("SELECT 1 FROM nonces WHERE key_id = ? AND nonce = ? AND expires_at >= ?",
                             (key_id, nonce, now)).fetchone()
        if row is not None:
            raise _replayed(key_id, nonce)

    def claim(self, key_id: str, nonce: str, now: float) -> None:
        """Record the nonce; a nonce seen before (and not yet expired) is a replay (401)."""
        with self._db.connect() as db:
            db.execute("DELETE FROM nonces WHERE expires_at < ?", (now,))
            try:
                db.execute("INSERT INTO nonces (key_id, nonce, expires_at) VALUES (?, ?, ?)",
                           (key_id, nonce, now + self._ttl_s))
            except sqlite3.IntegrityError as exc:
                raise _replayed(key_id, nonce) from exc


def _replayed(key_id: str, nonce: str) -> AuthenticationError:
    return AuthenticationError(f"nonce {nonce!r} was already used with key {key_id}: a replayed "
                               "request; sign each request with a fresh nonce")
