"""Which files the scheduled replay may read: its parameters come through the Prefect API.

The nightly replay's ``catalog`` and ``audit_log`` are flow parameters, editable by anyone who
reaches the API, and the run reads them with the worker's rights. So they are bounded: the
catalog is the bundled one (``incidents/catalog.json`` beside the running code, which
``prefect.yaml``'s nightly deployment names) or a file under the state directory; the audit log
is a file under the state directory. Paths are compared after every symlink is resolved::

    bounded_replay_files("incidents/catalog.json", None, code_root=Path("/srv/denpex"), state_dir=...)
      -> (Path("/srv/denpex/incidents/catalog.json"), None)
    bounded_replay_files("/etc/passwd", None, ...)       -> FlowParameterError
    bounded_replay_files(CATALOG, "/home/x/audit.jsonl")  -> FlowParameterError (not under the state directory)
"""

from __future__ import annotations

import os
from pathlib import Path

from denpex.workflow.flow_parameters import FlowParameterError

__all__ = ["BUNDLED_CATALOG", "bounded_replay_files"]

BUNDLED_CATALOG = Path("incidents") / "catalog.json"
"""The bundled catalog, relative to the folder that holds the running code."""


def bounded_replay_files(catalog: str, audit_log: str | None, *, code_root: Path,
                         state_dir: Path | None) -> tuple[Path, Path | None]:
    """The catalog and audit log to read, resolved; FlowParameterError naming every path that is
    neither the bundled catalog nor under ``state_dir`` (None: no state directory is set, so only
    the bundled catalog and no audit log may be read). A relative path is read from ``code_root``."""
    bundled = (code_root / BUNDLED_CATALOG).resolve()
    found = _resolved(catalog, code_root)
    problems = []
    if found != bundled and not _under(found, state_dir):
        problems.append(f"catalog {catalog!r} is neither the bundled catalog ({BUNDLED_CATALOG}) nor a file under "
                        "the state directory")
    log = _resolved(audit_log, code_root) if audit_log is not None else None
    if log is not None and not _under(log, state_dir):
        problems.append(f"audit_log {audit_log!r} is not a file under the state directory")
    if problems:
        raise FlowParameterError("invalid replay parameters: " + "; ".join(problems) + " (they come through the "
                                 "Prefect API, and the run reads with the worker's rights); nothing was read")
    return found, log


def _resolved(path: str, code_root: Path) -> Path:
    given = Path(path)
    return (given if given.is_absolute() else code_root / given).resolve()


def _under(path: Path, folder: Path | None) -> bool:
    if folder is None:
        return False
    root = folder.resolve()
    return path != root and os.path.commonpath([path, root]) == str(root)
