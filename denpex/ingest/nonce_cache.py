"""The replay cache: each (key, nonce) is accepted once, and remembered across restarts.

A nonce only has to be remembered for as long as its timestamp could still pass the skew check
(twice the window, to cover a timestamp that was ahead of the clock), so entries expire then.
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

    def claim(self, key_id: str, nonce: str, now: float) -> None:
        """Record the nonce; a nonce seen before (and not yet expired) is a replay (401)."""
        with self._db.connect() as db:
            db.execute("DELETE FROM nonces WHERE expires_at < ?", (now,))
            try:
                db.execute("INSERT INTO nonces (key_id, nonce, expires_at) VALUES (?, ?, ?)",
                           (key_id, nonce, now + self._ttl_s))
            except sqlite3.IntegrityError as exc:
                raise AuthenticationError(f"nonce {nonce!r} was already used with key {key_id}: a replayed "
                                          "request; sign each request with a fresh nonce") from exc
