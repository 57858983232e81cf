"""The flows' parameters, checked with the ingest service's own rules before anything uses them.

A run can be started by anyone who reaches the Prefect API (a manual run, an event), so its
parameters are input like a request's: tenant and cluster are names as ``denpex.ingest.registry``
takes them, the job and alert ids and the incident id follow ``denpex.ingest.identity``, and an
evidence location never climbs with ``..``. Every problem is reported at once::

    check_flow_parameters(tenant="acme", cluster="lab", incident_id="../../x")
    # FlowParameterError: invalid flow parameters: incident_id '../../x' must match ...

The evidence is then bound to the incident (:func:`check_evidence_binding`): it must be the
folder the ingest service stores that incident in, ``<root>/<tenant>/<cluster>/<job>/<incident>``,
so a run started for one tenant's cluster cannot triage another tenant's uploads, or a folder
someone forged, and show that to the approver as this incident's evidence. With no root
configured, no run reads anything.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence

from denpex.ingest.errors import RegistryError
from denpex.ingest.identity import ID_PATTERN, INCIDENT_ID_PATTERN
from denpex.ingest.layout import incident_prefix, join_uri
from denpex.ingest.registry import check_name

__all__ = ["EVIDENCE_ROOT_ENV", "FlowParameterError", "check_evidence_binding", "check_flow_parameters",
           "evidence_roots"]

EVIDENCE_ROOT_ENV = "DENPEX_EVIDENCE_ROOT"
"""The flow worker's setting: the ingest service's ``--store`` (``s3://evidence``, an absolute
folder); several, separated by whitespace, where several services feed one worker. An environment
variable on the worker, never a block or a parameter: both are editable by anyone
who reaches the Prefect API, the very party the binding guards against."""


def evidence_roots(environ: Mapping[str, str]) -> list[str]:
    """The roots :data:`EVIDENCE_ROOT_ENV` names in ``environ``; none when it is unset or blank."""
    return environ.get(EVIDENCE_ROOT_ENV, "").split()


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


def check_evidence_binding(evidence: str, *, tenant: str, cluster: str, job_id: str, incident_id: str,
                           roots: Sequence[str]) -> str:
    """The location to read the incident's evidence from; FlowParameterError unless ``evidence`` is
    the incident's own folder, ``<root>/<tenant>/<cluster>/<job>/<incident>``, in one of ``roots``
    (the ingest services' stores).

    An ``s3://`` location is compared as S3 reads it, character for character (a trailing ``/``
    aside): ``acme//lab`` or ``./acme`` is another key prefix, not a spelling of ``acme/lab``. A
    folder is compared as the file system reads it (``//`` and ``.`` folded). The caller reads the
    location returned, never its own spelling of it. No roots: nothing is bound, so nothing is
    read. Call it after :func:`check_flow_parameters` (the parts are then names without ``/`` or
    ``..``).
    """
    if not roots:
        raise FlowParameterError(
            f"{EVIDENCE_ROOT_ENV} is not set on this worker: set it to the ingest service's --store, so "
            "a run triages only an incident's own folder there (denpex triage FOLDER reads any folder, "
            "and acts on nothing); nothing was done")
    problems = _evidence_problems(evidence)  # a '..' folded away below would read another folder
    if problems:
        raise FlowParameterError("invalid flow parameters: " + "; ".join(problems) + "; nothing was done")
    prefix = incident_prefix(tenant, cluster, job_id, incident_id)
    given = _location(evidence)
    if _bound_root(given, prefix, [_root(root) for root in roots]) is not None:
        return given
    # The roots are not named: the message becomes the run's state, readable through the API (only a
    # misconfigured root is named, by _root, so that its operator can mend it).
    raise FlowParameterError(
        f"evidence {evidence!r} is not incident {incident_id}'s folder: the ingest service stores it at "
        f"{prefix!r} under one of the worker's evidence roots ({EVIDENCE_ROOT_ENV}); nothing was done")


def _bound_root(location: str, prefix: str, roots: Sequence[str]) -> str | None:
    """The root whose incident ``location`` is, or None.

    With nested roots (``s3://evidence`` and ``s3://evidence/ingest``), a tenant named ``ingest``
    would bind, under the outer root, a folder inside the inner root, where the inner service's
    tenants live: such a location is nobody's incident."""
    owner = max((root for root in roots if _inside(location, root)), key=len, default=None)  # the innermost
    return owner if owner is not None and join_uri(owner, prefix) == location else None


def _inside(location: str, root: str) -> bool:
    return location.startswith(root.rstrip("/") + "/")


def _root(root: str) -> str:
    """A configured root as :func:`_location` writes it; a relative folder, ``..`` or an S3 URI
    without a bucket is a misconfiguration, refused rather than read from the worker's cwd."""
    text = root.removeprefix("file://")
    problems = _evidence_problems(root)
    if not root.startswith("s3://") and not text.startswith("/"):
        problems.append(f"{root!r} is a relative folder; give an absolute one")
    elif not root.startswith("s3://") and posixpath.normpath(text) == "/":
        problems.append("'/' is the whole file system, not an ingest service's store")
    if problems:
        raise FlowParameterError(f"{EVIDENCE_ROOT_ENV} entry {root!r} is not usable: " + "; ".join(problems)
                                 + "; nothing was done")
    return _location(root)


def _location(uri: str) -> str:
    """``s3://b/p/`` -> ``s3://b/p`` (S3 keys are literal: nothing else changes); ``file:///srv//x/.``
    -> ``/srv/x`` (as the file system resolves it; ``..`` is refused before this)."""
    if uri.startswith("s3://"):
        return uri.rstrip("/")
    return posixpath.normpath(uri.removeprefix("file://"))
