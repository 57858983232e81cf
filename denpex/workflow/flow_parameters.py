"""The flows' parameters, checked with the ingest service's own rules before anything uses them.

A run can be started by anyone who reaches the Prefect API (a manual run, an event), so its
parameters are input like a request's: tenant and cluster are names as ``denpex.ingest.registry``
takes them, the job and alert ids and the incident id follow ``denpex.ingest.identity``, and an
evidence location never climbs with ``..``. Every problem is reported at once::

    check_flow_parameters(tenant="acme", cluster="lab", incident_id="../../x")
    # FlowParameterError: invalid flow parameters: incident_id '../../x' must match ...
"""

from __future__ import annotations

import re

from denpex.ingest.errors import RegistryError
from denpex.ingest.identity import ID_PATTERN, INCIDENT_ID_PATTERN
from denpex.ingest.registry import check_name

__all__ = ["FlowParameterError", "check_flow_parameters"]


class FlowParameterError(ValueError):
    """A flow parameter fails the ingest service's rules; the run does nothing."""


def check_flow_parameters(*, tenant: str | None = None, cluster: str | None = None, job_id: str | None = None,
                          incident_id: str | None = None, alert_id: str | None = None,
                          evidence: str | None = None) -> None:
    """Raise FlowParameterError naming every given parameter (not None) that is not valid."""
    problems = []
    for kind, value in (("tenant", tenant), ("cluster", cluster)):
        if value is not None:
            try:
                check_name(kind, value)
            except RegistryError as exc:
                problems.append(str(exc))
    for kind, value, pattern in (("job_id", job_id, ID_PATTERN), ("incident_id", incident_id, INCIDENT_ID_PATTERN),
                                 ("alert_id", alert_id, ID_PATTERN)):
        if value is not None and not re.fullmatch(pattern, value):
            problems.append(f"{kind} {value!r} must match {pattern} (no slashes, no dot-dot)")
    if evidence is not None:
        problems += _evidence_problems(evidence)
    if problems:
        raise FlowParameterError("invalid flow parameters: " + "; ".join(problems) + "; nothing was done")


def _evidence_problems(uri: str) -> list[str]:
    """A folder, ``file://`` or ``s3://bucket/prefix``, with no ``..`` part and no control character."""
    problems = []
    if any(ord(c) < 32 or ord(c) == 127 for c in uri) or not uri.strip():
        problems.append(f"evidence {uri!r} is empty or holds a control character")
    rest = uri.removeprefix("file://")
    if uri.startswith("s3://"):
        rest = uri[5:]
        if not rest.partition("/")[0]:
            problems.append(f"evidence {uri!r} names no bucket")
    elif "://" in rest:
        problems.append(f"evidence {uri!r} is neither a folder nor an s3:// URI")
    if ".." in rest.split("/"):
        problems.append(f"evidence {uri!r} climbs with '..'; name the folder or prefix itself")
    return problems
