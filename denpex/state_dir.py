"""The one machine-wide state directory (``$DENPEX_STATE_DIR``).

Everything that must be shared by every operator and service on a machine lives here: the
isolation path's breaker, run lock and audit log, and the ingest service's tenants, keys, nonce
cache and incidents. A relative path would give each working directory a state of its own (a
fresh breaker, a separate lock), so it is refused.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["DEFAULT_STATE_DIR", "STATE_DIR_ENV", "StateDirError", "resolve_state_dir"]

STATE_DIR_ENV = "DENPEX_STATE_DIR"
DEFAULT_STATE_DIR = Path("/var/lib/denpex")


class StateDirError(ValueError):
    """The state directory is not an absolute path."""


def resolve_state_dir(explicit: str | Path | None = None,
                      environ: Mapping[str, str] | None = None) -> Path:
    """``explicit``, else ``$DENPEX_STATE_DIR``, else ``/var/lib/denpex``; always absolute.

    >>> resolve_state_dir("/srv/denpex")
    PosixPath('/srv/denpex')
    """
    env = os.environ if environ is None else environ
    raw = explicit if explicit is not None else env.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
    path = Path(raw).expanduser()
    if not path.is_absolute():
        raise StateDirError(
            f"the state directory {str(raw)!r} is relative; set {STATE_DIR_ENV} to an absolute path "
            "so that every operator on this machine shares one breaker, lock and audit log"
        )
    return path
