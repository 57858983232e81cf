"""One rule for a file only its owner may read: a key, a token, a secret. Whoever else can read
it can act as its owner (sign a decision, forge the audit chain, reach a cluster)."""

from __future__ import annotations

import stat
from pathlib import Path

__all__ = ["shared_file_problem"]


def shared_file_problem(path: Path, mode: int, what: str) -> str | None:
    """Why ``path`` (with ``mode``, from its stat) is unfit to hold ``what``: group or others may
    read, write or enter it; None when it is its owner's alone. Each caller raises its own error."""
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        return (f"{path}: the {what} is accessible to group or others (mode {stat.S_IMODE(mode):o}); "
                f"run `chmod 600 {path}` as the service user")
    return None
