"""The incident flow's name and its own log, visible in the run's page.

Runs are named ``<cluster>/<incident>`` (``denpex.workflow.run_story``: the parameters are
untrusted, so the name is bounded and sanitized). The flow's own steps (coverage, verdict, plan,
approval, what ran) log at INFO on ``prefect.flow_runs.denpex``, a child of Prefect's run logger
whose level is its own: ``PREFECT_LOGGING_LEVEL=WARNING`` (the demo's, to keep the terminal quiet)
keeps Prefect's chatter out of the Logs tab, not the incident's story. The records reach the
run's Logs tab through the API handler of ``prefect.flow_runs``, which they propagate to.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect.logging import get_run_logger
from prefect.logging.loggers import PrefectLogAdapter
from prefect.runtime import flow_run

from denpex.workflow.run_story import incident_run_name

__all__ = ["FLOW_LOGGER", "incident_log", "incident_run"]

FLOW_LOGGER = "prefect.flow_runs.denpex"


def incident_run() -> str:
    """``flow_run_name`` for the incident flows: ``<cluster>/<incident>`` from the run's parameters."""
    parameters: dict[str, Any] = flow_run.parameters or {}
    return incident_run_name(parameters.get("cluster"), parameters.get("incident_id"))


def incident_log() -> logging.LoggerAdapter[logging.Logger]:
    """The current run's logger for the flow's own steps, at INFO whatever Prefect's level is."""
    run = get_run_logger()
    own = logging.getLogger(FLOW_LOGGER)
    own.setLevel(logging.INFO)
    return PrefectLogAdapter(own, extra=dict(getattr(run, "extra", None) or {}))
