"""The workflow section of a runbook: how long the incident flow waits, and for what.

It sits beside the isolation policy in the same runbook file (``workflow:``)::

    workflow:
      evidence_grace: PT2M        # wait this long for every rank's dump after the alert
      coverage_poll: PT5S         # how often the store is listed meanwhile
      approval_timeout: PT1H      # how long the run stays paused for a person
      approval_poll: PT10S        # how often the paused run looks for an answer
      remediation_retries: 3      # retries of transient faults only (never a refused gate)
      review_age: P7D             # drains older than this are listed by the nightly replay

The limits, approvers and steps stay in the policy part of the runbook (``policy``). The section is
here, beside the runbook that holds it (``runbook``), though only the incident workflow reads it.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["WorkflowSection"]


class WorkflowSection(BaseModel):
    """Timing of the incident flow. Defaults suit production; tests shorten them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    evidence_grace: timedelta = Field(default=timedelta(minutes=2), ge=timedelta(0))
    """After the alert, how long to wait for ranks 0..world_size-1 before triaging what is there."""
    coverage_poll: timedelta = Field(default=timedelta(seconds=5), gt=timedelta(0))
    approval_timeout: timedelta = Field(default=timedelta(hours=1), gt=timedelta(0))
    """A run paused longer than this ends without touching the cluster."""
    approval_poll: timedelta = Field(default=timedelta(seconds=10), gt=timedelta(0))
    remediation_retries: int = Field(default=3, ge=0, le=10)
    review_age: timedelta = Field(default=timedelta(days=7), gt=timedelta(0))
