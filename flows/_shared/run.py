"""This flow run and the configuration it runs with: its id, the state directory, the runbook
the operator's block names, and the blocks it reads. Every flow of the project shares them."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from prefect.blocks.core import Block
from prefect.runtime import flow_run

from blocks.runbook import DEFAULT_RUNBOOK, DenpexRunbook, form_runbooks, runbook_path
from blocks.targets import block_name_for
from denpex.isolation.errors import RunbookError
from denpex.isolation.runbook import Runbook, form_runbook_refusal, load_runbook
from denpex.state_dir import resolve_state_dir

__all__ = ["load_block", "state_dir", "run_id", "artifact_prefix", "load_runbook_for_flow"]

B = TypeVar("B", bound=Block)


def load_block(kind: type[B], name: str) -> B | None:
    try:
        return kind.load(name)  # type: ignore[return-value]
    except ValueError:  # Prefect raises ValueError for a block document that does not exist
        return None


def state_dir() -> Path:
    return resolve_state_dir()


def run_id() -> str:
    return str(flow_run.get_id() or "local")


def artifact_prefix(incident_id: str) -> str:
    """Artifact keys take lowercase letters, digits and dashes."""
    return "denpex-" + block_name_for(incident_id)


def load_runbook_for_flow() -> tuple[Runbook, Path]:
    """The runbook the ``default`` DenpexRunbook block names (else hang-triage), from the operator's folder."""
    block = load_block(DenpexRunbook, "default")
    name = block.name if block else DEFAULT_RUNBOOK
    path = runbook_path(name)
    runbook = load_runbook(path)
    refusal = form_runbook_refusal(name, runbook, form_runbooks())
    if refusal:
        raise RunbookError(refusal)
    return runbook, path
