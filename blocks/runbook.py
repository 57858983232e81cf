"""Which runbook the flow executes: a name only, resolved in the operator's runbook folder.

The limits, approvers and channels stay in that reviewed file. A block editable through the
Prefect API can pick another reviewed runbook, never write one: names are checked, paths refused.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect.blocks.core import Block
from pydantic import Field

__all__ = ["DenpexRunbook", "RUNBOOKS_DIR_ENV", "FORM_RUNBOOKS_ENV", "runbooks_dir", "runbook_path",
           "form_runbooks"]

RUNBOOKS_DIR_ENV = "DENPEX_RUNBOOKS_DIR"
FORM_RUNBOOKS_ENV = "DENPEX_PREFECT_FORM_RUNBOOKS"
_REPO_RUNBOOKS = Path(__file__).resolve().parent.parent / "runbooks"
DEFAULT_RUNBOOK = "hang-triage"


def runbooks_dir() -> Path:
    """``$DENPEX_RUNBOOKS_DIR`` (the operator's folder), else the repository's ``runbooks/``."""
    return Path(os.environ.get(RUNBOOKS_DIR_ENV) or _REPO_RUNBOOKS)


def form_runbooks() -> frozenset[str]:
    """The runbooks without a second factor that the operator allows on this worker
    (``$DENPEX_PREFECT_FORM_RUNBOOKS``, names separated by spaces or commas)."""
    return frozenset(os.environ.get(FORM_RUNBOOKS_ENV, "").replace(",", " ").split())


def runbook_path(name: str) -> Path:
    """The file of runbook ``name`` in the runbook folder."""
    return runbooks_dir() / f"{name}.yaml"


class DenpexRunbook(Block):
    """Names the runbook the incident flow executes."""

    _block_type_slug = "denpex-runbook"
    _block_type_name = "Denpex Runbook"

    name: str = Field(default=DEFAULT_RUNBOOK, pattern=r"^[a-z0-9][a-z0-9-]{1,62}$",
                      description="A runbook name in the operator's runbook folder (no path).")
