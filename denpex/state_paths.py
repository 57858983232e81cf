"""Paths inside the state directory, built from names that may come from flow parameters.

``state_path(Path("/var/lib/denpex"), "plans", "inc-7.json")`` is
``/var/lib/denpex/plans/inc-7.json``; ``state_path(..., "plans", "../../../x.json")`` raises
StatePathError, as does any part that is empty, ``.`` or ``..``, or holds a slash or a NUL.
The check is on the names, not on the file system: no symlink the operator set up is judged.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["StatePathError", "state_path", "UNOWNED", "INGEST_DATABASE", "plan_file", "legacy_plan_file",
           "report_file"]

INGEST_DATABASE = "ingest.sqlite3"
"""The ingest service's registry in the state directory. ``denpex.ingest.database`` writes it;
cluster ownership (``denpex.tenancy``) and the incident flow read it, so its name lives here, below
all three."""


class StatePathError(ValueError):
    """A path built from names would leave the state directory."""


def state_path(state_dir: Path, *parts: str) -> Path:
    """``state_dir`` joined with ``parts``, each one plain file or folder name."""
    bad = [p for p in parts if p in ("", ".", "..") or "/" in p or os.sep in p or "\0" in p]
    if bad or not parts:
        raise StatePathError(f"{', '.join(map(repr, bad)) or 'nothing'} is not a plain name inside the state "
                             f"directory {str(state_dir)!r}; nothing was read or written")
    path = state_dir.joinpath(*parts)
    # Belt and braces: the names above cannot climb, and this says so for whatever joins them.
    if os.path.commonpath([os.path.normpath(path), os.path.normpath(state_dir)]) != os.path.normpath(state_dir):
        raise StatePathError(f"{str(path)!r} is outside the state directory {str(state_dir)!r}")
    return path


UNOWNED = "_unowned"
"""The tenant folder of a cluster with no registered owner (no tenant name starts with ``_``)."""


def plan_file(state_dir: Path, tenant: str | None, cluster: str, incident_id: str) -> Path:
    """Where an incident's plan is kept: ``plans/<tenant>/<cluster>/<incident>.json``, so that
    another tenant's incident of the same id, on its own cluster, never lands on it."""
    return state_path(state_dir, "plans", tenant or UNOWNED, cluster, f"{incident_id}.json")


def legacy_plan_file(state_dir: Path, incident_id: str) -> Path:
    """Where plans were kept before they were keyed by tenant and cluster (read, never written)."""
    return state_path(state_dir, "plans", f"{incident_id}.json")


def report_file(state_dir: Path, tenant: str | None, cluster: str, incident_id: str, run_id: str) -> Path:
    """An incident run's final report: ``reports/<tenant>/<cluster>/<incident>-<run>.json``."""
    return state_path(state_dir, "reports", tenant or UNOWNED, cluster, f"{incident_id}-{run_id}.json")
